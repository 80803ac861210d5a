"""Module-level datasets and functions for the worker-process tests (spawn pickles them)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dualtrain import accelerate_dataset
from dualtrain.fuel import Brighten, Comburant, Crop, Flip

SIZE = 256  # float32 values per item: about 1 KiB pickled


def count(path: str | None) -> None:
    """Adds one load to the file counter at `path` (one byte per load, appended atomically)."""
    if path is None:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)


def loads(path: str) -> int:
    """Loads counted at `path` so far."""
    return os.path.getsize(path) if os.path.exists(path) else 0


class Squares:
    """Items ``{"x": float32[SIZE] of i * i, "i": i}``; each load counted in `counter`.

    `bad`: the index whose load raises (a message that does not name the index).
    """

    def __init__(self, n: int, counter: str | None = None, bad: int | None = None) -> None:
        self.n, self.counter, self.bad = n, counter, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int(i)
        count(self.counter)
        if i == self.bad:
            raise ValueError("the source broke here")
        return {"x": np.full(SIZE, i * i, dtype=np.float32), "i": i}


# Budget of the decorated class: every item fits (30 items of ~1.2 KiB).
DECORATED_BUDGET = 1 << 20


@accelerate_dataset(max_memory_size=DECORATED_BUDGET, preloaded_data=4, threads=0)
class DecoratedSquares(Squares):
    """`Squares` with nebulgym's decorator: each instance caches its items."""


def write_forever(path: str, limit: int, start: int) -> None:
    """A child writing new items into the shared folder at `path` until it is killed."""
    from dualtrain.preload.shared import SharedStore

    store = SharedStore(path, limit)
    key = start
    while True:
        store.write(key, np.full(4096, key, dtype=np.float64))
        key += 1


def write_keys(path: str, limit: int, keys: list[int], size: int) -> list[bool]:
    """Writes ``float64[size]`` items of `keys` into the shared folder at `path`."""
    from dualtrain.preload.shared import SharedStore

    store = SharedStore(path, limit)
    return [store.write(k, np.full(size, k, dtype=np.float64)) for k in keys]


def read_keys(path: str, limit: int, keys: list[int], size: int, rounds: int) -> int:
    """Reads `keys` from the shared folder `rounds` times; every item found must be whole.

    Returns how many were found (raises AssertionError on a partial or wrong item).
    """
    from dualtrain.preload.shared import SharedStore

    store = SharedStore(path, limit)
    found = 0
    for _ in range(rounds):
        for k in keys:
            ok, item = store.read(k)
            if ok:
                assert item.shape == (size,) and (item == k).all(), (k, item)
                found += 1
    return found


def square(counter: str | None, key: int) -> np.ndarray:
    """A PreloadCache loader: ``float64[512]`` of key * key, each load counted."""
    count(counter)
    return np.full(512, key * key, dtype=np.float64)


def cache_worker(cache: Any, keys: list[int]) -> list[float]:
    """A child process's use of a shared PreloadCache: its items' first values."""
    return [float(cache.get(k)[0]) for k in keys]


def cache_worker_stats(cache: Any, keys: list[int]) -> dict[str, Any]:
    """Gets `keys` from a shared PreloadCache; returns the items and the child's counters."""
    values = [float(cache.get(k)[0]) for k in keys]
    return {"values": values, "owner": cache._owner}


def ledger_at_rename(path: str, limit: int, key: int) -> tuple[int, int, int]:
    """Writes `key` and returns (ledger before, ledger when the item file appears, size).

    An audit hook reads the ledger file at the rename that makes the item visible; the
    hook stays installed for the rest of this (child) process.
    """
    import pickle
    import struct
    import sys

    from dualtrain.preload.shared import SharedStore

    seen: list[int] = []
    ledger = os.path.join(path, "ledger")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "os.rename" and str(args[1]).startswith(path):
            with open(ledger, "rb") as f:
                seen.append(struct.unpack("<q", f.read(8))[0])

    sys.addaudithook(hook)
    store = SharedStore(path, limit)
    before = store.used
    item = np.full(300, key, dtype=np.float64)
    assert store.write(key, item)
    return before, seen[0], len(pickle.dumps(item, protocol=5))


# A Tank's augmentation (module level: a Tank's process workers pickle it).
AUGMENT = Comburant(Flip(), Crop(area=(0.5, 1.0)), Brighten(0.2))


def augment(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "image": AUGMENT(sample["image"])}


def fetch_augmented(pack: Any, index: int) -> dict[str, Any]:
    """A fetch_fn drawing per sample (refused with preload: it belongs in prep_fn)."""
    from dualtrain.fuel import images

    image = images.decode(pack["image"][index])
    return {"image": AUGMENT(image), "label": np.asarray(pack["label"][index])}


def copies_in_one_process(cache: Any, copies: int) -> dict[str, int]:
    """Unpickles `copies` copies of a shared cache in this process, each getting one key."""
    import pickle

    data = pickle.dumps(cache)
    before = len(os.listdir("/proc/self/fd"))
    for n in range(copies):
        copy = pickle.loads(data)
        copy.get(n % 10)
        del copy
    return {"fds_opened": len(os.listdir("/proc/self/fd")) - before, "pid": os.getpid()}


class Locked(Squares):
    """`Squares` whose loads hold a process-wide lock for a while (as h5py's global lock)."""

    lock = __import__("threading").Lock()

    def __getitem__(self, i: int) -> dict[str, Any]:
        with self.lock:
            __import__("time").sleep(0.002)
            return super().__getitem__(i)


class Sized:
    """Items of ``bytes`` whose sizes `sizes` gives; each load counted in `counter`."""

    def __init__(self, sizes: list[int], counter: str | None = None) -> None:
        self.sizes, self.counter = sizes, counter

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> bytes:
        count(self.counter)
        return bytes([i % 256]) * self.sizes[int(i)]


class Forky:
    """Items whose load forks a child (a source shelling out, say), after a short sleep."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        __import__("time").sleep(0.05)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        return np.full(4, i)
