"""Preloaded datasets under torch's DataLoader with worker processes (fork and spawn)."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from dualtrain import Preloader  # noqa: E402
from dualtrain.preload.shared import _base_dir  # noqa: E402
from tests.preload import workers_data as wd  # noqa: E402

# These tests fork. JAX, when another test of this worker imported it, warns at every fork
# that a forked JAX may deadlock; the children here never use JAX.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")

N = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PAGE = os.statvfs(_base_dir()).f_bsize
# What one item takes in the shared folder: its pickle, in whole blocks.
ITEM_BYTES = -(-len(pickle.dumps(wd.Squares(1)[0], protocol=5)) // PAGE) * PAGE


def item_files(path: str) -> dict[str, int]:
    return {
        # What the file takes in memory: whole blocks (tmpfs gives even a small file one).
        name: os.stat(os.path.join(path, name)).st_blocks * 512
        for name in os.listdir(path)
        if name != "ledger" and not name.startswith("stats-") and ".tmp" not in name
    }


def loader(dataset, method: str | None, persistent: bool = False, seed: int = 7) -> DataLoader:
    workers = 0 if method is None else 2
    return DataLoader(
        dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed),
        num_workers=workers, multiprocessing_context=method,
        persistent_workers=persistent and workers > 0,
    )  # fmt: skip


def reference(persistent: bool) -> DataLoader:
    """The plain dataset, drawn in the same order (persistent workers draw seeds once)."""
    return loader(wd.Squares(N), "fork" if persistent else None, persistent)


def assert_same_epoch(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def make(kind: str, counter: str, budget: int = 1 << 20):
    if kind == "decorated":
        dataset = wd.DecoratedSquares(N, counter)
        return dataset, dataset.preloader
    preloader = Preloader(wd.Squares(N, counter), budget, preloaded_data=4)
    return preloader, preloader


CASES = [
    ("fork", False, "decorated"),
    ("fork", True, "decorated"),
    ("fork", False, "preloader"),
    ("fork", True, "preloader"),
    pytest.param("spawn", True, "decorated", marks=pytest.mark.slow),
    pytest.param("spawn", False, "preloader", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("method", "persistent", "kind"), CASES)
def test_workers_serve_the_plain_batches_from_one_shared_cache(tmp_path, method, persistent, kind):
    counter = str(tmp_path / "loads")
    dataset, preloader = make(kind, counter)
    budget = preloader.max_memory_size
    fast, plain = loader(dataset, method, persistent), reference(persistent)
    before = preloader.stats()
    for epoch in range(2):
        assert_same_epoch(list(fast), list(plain))
        stats = preloader.stats()
        # Each item is loaded once, by one worker, over both epochs.
        assert wd.loads(counter) == N
        assert stats["loads"] == N
        if epoch == 1:  # every item of the second epoch came from the shared folder
            assert stats["hits"] - before["hits"] == N
            assert stats["misses"] == before["misses"]
        before = stats
        path = preloader.cache._store.path
        files = item_files(path)
        assert len(files) == N
        assert stats["resident_bytes"] == sum(files.values()) <= budget
    del fast, dataset, preloader
    gc.collect()
    assert not os.path.exists(path)  # the owner's dataset went: its folder with it


def test_a_budget_for_part_of_the_data_is_kept_and_every_item_served(tmp_path):
    counter = str(tmp_path / "loads")
    budget = 8 * ITEM_BYTES
    dataset, preloader = make("preloader", counter, budget)
    fast, plain = loader(dataset, "fork", persistent=True), reference(True)
    for _ in range(2):
        got = []
        for batch in fast:
            got.append(batch)
            files = item_files(preloader.cache._store.path)
            assert sum(files.values()) <= preloader.stats()["resident_bytes"] <= budget
        assert_same_epoch(got, list(plain))
    files = item_files(preloader.cache._store.path)
    assert len(files) == 8
    stats = preloader.stats()
    assert stats["hits"] == 8 and stats["loads"] == 2 * N - 8 == wd.loads(counter)
    assert stats["not_kept"] == 2 * (N - 8)
    del fast
    preloader.cache._finalizer()


@pytest.mark.parametrize("kind", ["decorated", "preloader"])
def test_a_source_error_in_a_worker_names_the_index(kind):
    if kind == "decorated":
        dataset = wd.DecoratedSquares(N, bad=13)
    else:
        dataset = Preloader(wd.Squares(N, bad=13), 1 << 20)
    fast = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(ValueError, match=r"the source broke here") as info:
        list(fast)
    assert "while loading item 13 for the preload cache" in str(info.value)


def test_a_planned_sampler_under_workers_loads_the_items_about_once(tmp_path):
    # Once workers use the shared folder the owner stops loading ahead (they do, in the
    # sampler's order); before their first item it may have loaded its first window, which
    # they may load again. Before the fix its loads sat in its memory, read by no worker.
    counter = str(tmp_path / "loads")
    preloader = Preloader(wd.Squares(N, counter), 1 << 20, preloaded_data=8)
    sampler = preloader.sampler(shuffle=True, seed=3)
    fast = DataLoader(
        preloader, batch_size=4, sampler=sampler, num_workers=2, multiprocessing_context="fork"
    )
    order = Preloader(wd.Squares(N), 0, threads=0).sampler(shuffle=True, seed=3)
    plain = [wd.Squares(N)[i] for i in order]
    try:
        got = [int(i) for batch in fast for i in batch["i"]]
        assert got == [item["i"] for item in plain]
        preloader.close()  # the main process's loads ahead, if any, are done
        assert N <= wd.loads(counter) <= N + 8  # at most one window loaded twice
        assert preloader.stats()["local_bytes"] == 0  # all of it in the shared folder
    finally:
        preloader.cache._finalizer()


@pytest.mark.slow
def test_the_shared_folder_goes_when_the_owner_exits(tmp_path):
    code = (
        "import sys, torch\n"
        "from torch.utils.data import DataLoader\n"
        "from tests.preload import workers_data as wd\n"
        "ds = wd.DecoratedSquares(12)\n"
        "batches = list(DataLoader(ds, batch_size=4, num_workers=2,"
        " multiprocessing_context='fork'))\n"
        "assert len(batches) == 3\n"
        "path = ds.preloader.cache._store.path\n"
        "assert len([n for n in __import__('os').listdir(path) if n.startswith('i')]) == 12\n"
        "print(path)\n"
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip().splitlines()[-1]
    assert path.startswith(("/dev/shm/", "/tmp")) and "dualtrain-preload-" in path
    assert not os.path.exists(path)


def test_items_match_the_plain_dataset_after_pickling(tmp_path):
    # What a spawn worker receives: the decorated instance, pickled while shared.
    dataset = wd.DecoratedSquares(N, str(tmp_path / "loads"))
    assert dataset[3]["i"] == 3
    copy = pickle.loads(pickle.dumps(dataset))
    assert type(copy) is wd.DecoratedSquares
    for i in (3, 5, -1):
        a, b = copy[i], wd.Squares(N)[i % N]
        assert a["i"] == b["i"] and np.array_equal(a["x"], b["x"])
    assert not copy.preloader.cache._owner
