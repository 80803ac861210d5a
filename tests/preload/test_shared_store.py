"""The shared folder of a preload cache under real processes: budget, atomic items, kills."""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.preload import PreloadCache
from dualtrain.preload.shared import SharedStore, _base_dir, sweep
from tests.preload import workers_data as wd

# These tests fork. JAX, when another test of this worker imported it, warns at every fork
# that a forked JAX may deadlock; the children here never use JAX.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")

ITEM = 512  # float64 values per item written by the helpers: about 4 KiB pickled
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


PAGE = os.statvfs(_base_dir()).f_bsize  # a stored item takes whole blocks of this


def charged(n: int) -> int:
    return -(-n // PAGE) * PAGE


def item_size(key: int, size: int = ITEM) -> int:
    """What an item takes in the folder (and the ledger): its pickle in whole blocks."""
    return charged(len(pickle.dumps(np.full(size, key, dtype=np.float64), protocol=5)))


def item_files(path: str) -> dict[str, int]:
    """The item files of a shared folder and their sizes (no ledger, counters or .tmp)."""
    return {
        # What the file takes in memory: whole blocks (tmpfs gives even a small file one).
        name: os.stat(os.path.join(path, name)).st_blocks * 512
        for name in os.listdir(path)
        if name != "ledger" and not name.startswith("stats-") and ".tmp" not in name
    }


@pytest.fixture
def store():
    made = SharedStore.create(60 * item_size(0), 0)
    yield made
    made.remove()
    assert not os.path.exists(made.path)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_concurrent_writers_keep_the_ledger_exact_and_items_whole(store, method):
    ctx = multiprocessing.get_context(method)
    plans = [
        list(range(40)), list(range(20, 60)), list(range(59, -1, -1)), list(range(40, 80)),
    ]  # fmt: skip
    with ctx.Pool(5) as pool:
        reader = pool.apply_async(wd.read_keys, (store.path, store.limit, list(range(80)), ITEM, 5))
        writes = [
            pool.apply_async(wd.write_keys, (store.path, store.limit, keys, ITEM)) for keys in plans
        ]
        results = [w.get(timeout=300) for w in writes]
        reader.get(timeout=300)  # raises if it saw a partial or wrong item
    stored: dict[int, int] = {}
    for keys, oks in zip(plans, results, strict=True):
        for k, ok in zip(keys, oks, strict=True):
            stored[k] = stored.get(k, 0) + ok
    assert max(stored.values()) == 1  # each key stored by one process only
    files = item_files(store.path)
    assert {f"i{k}" for k, n in stored.items() if n} == set(files)
    assert store.used == sum(files.values()) <= store.limit
    assert store.limit - store.used < item_size(0)  # full: the rest did not fit
    for name in files:
        k = int(name[1:])
        found, item = store.read(k)
        assert found and item.shape == (ITEM,) and (item == k).all()


def test_the_ledger_counts_an_item_before_its_file_appears(store):
    # A writer killed between making the file visible and counting it would leave the
    # ledger under what the folder holds (the budget exceeded for good).
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        before, at_rename, size = pool.apply(wd.ledger_at_rename, (store.path, store.limit, 3))
    assert at_rename == before + charged(size)
    assert store.used == sum(item_files(store.path).values()) == charged(size)


def wait_for_an_item(
    path: str, first_key: int, child: multiprocessing.process.BaseProcess, timeout: float = 120.0
) -> None:
    """Polls until `child`, writing keys from `first_key` on, has stored one item."""
    name = f"i{first_key}"
    deadline = time.monotonic() + timeout
    while not os.path.exists(os.path.join(path, name)):
        assert child.is_alive(), f"the writer of {name} died: exit code {child.exitcode}"
        assert time.monotonic() < deadline, f"no {name} after {timeout} s"
        time.sleep(0.005)


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_a_consistent_store():
    limit = 1 << 28  # room for every write the children manage before they are killed
    store = SharedStore.create(limit, 0)
    try:
        ctx = multiprocessing.get_context("fork")
        rng = np.random.default_rng(0)
        children = [
            ctx.Process(target=wd.write_forever, args=(store.path, limit, 100_000 * c))
            for c in range(3)
        ]
        for child in children:
            child.start()
        for c, child in enumerate(children):
            # Killed only once it has written an item (however busy the machine), then at a
            # random moment of its writes: mid-write, or between two.
            wait_for_an_item(store.path, 100_000 * c, child)
            time.sleep(float(rng.uniform(0.0, 0.2)))
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            assert child.exitcode == -signal.SIGKILL
        files = item_files(store.path)
        assert files, "the children wrote nothing before they were killed"
        # Leftover temporary files are no items; the ledger never counts less than the items.
        assert all(".tmp" not in name for name in files)
        assert SharedStore(store.path, limit).files() == len(files)
        assert sum(files.values()) <= store.used <= limit
        reader = SharedStore(store.path, limit)  # the next process's view
        for name in files:
            k = int(name[1:])
            found, item = reader.read(k)
            assert found and item.shape == (4096,) and (item == k).all()
        assert reader.write(-1, np.arange(3.0)) and reader.read(-1)[0]
    finally:
        store.remove()
    assert not os.path.exists(store.path)


def _killed_owner() -> str:
    """The folder of a process that shared a cache and was then killed with SIGKILL."""
    code = (
        "import sys\n"
        "from dualtrain.preload import PreloadCache\n"
        "cache = PreloadCache(abs, max_memory_size=1 << 16, threads=0)\n"
        "cache.get(-3)\n"
        "print(cache.share(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()
        assert os.path.isdir(path)
        proc.kill()
        proc.wait()
    assert os.path.isdir(path)  # nobody removed it: its owner had no chance
    return path


def test_a_killed_owners_folder_is_removed_by_sweep_and_by_the_next_create():
    path = _killed_owner()
    assert path in sweep()
    assert not os.path.exists(path)
    path = _killed_owner()
    made = SharedStore.create(100, 0)
    try:
        assert not os.path.exists(path)
    finally:
        made.remove()


def test_a_forked_child_exiting_normally_leaves_the_owners_folder():
    # The child inherits the owner's finalizer; at its exit (atexit) it must not remove
    # the folder the owner and its other workers still use.
    cache = PreloadCache(functools.partial(wd.square, None), max_memory_size=1 << 20, threads=0)
    path = cache.share()
    assert path is not None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            cache.get(2)
            cache._finalizer()  # what the child's interpreter does at exit
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.path.isdir(path) and "i2" in item_files(path)
    assert cache.get(2)[0] == 4.0
    cache._finalizer()  # the owner's own removal still works
    assert not os.path.exists(path)


def test_a_worker_whose_folder_was_removed_serves_from_the_source(tmp_path):
    counter = str(tmp_path / "loads")
    load = functools.partial(wd.square, counter)
    owner = PreloadCache(load, max_memory_size=1 << 20, threads=0)
    path = owner.share()
    worker = PreloadCache(load, max_memory_size=1 << 20, threads=0, shared_path=path)
    assert not worker._owner
    assert [worker.get(k)[0] for k in range(4)] == [k * k for k in range(4)]
    assert wd.loads(counter) == 4
    owner._finalizer()  # the owner exits: its folder goes
    assert not os.path.exists(str(path))
    for k in range(6):  # stored before and never stored: all from the source, no error
        item = worker.get(k)
        assert item.shape == (512,) and (item == k * k).all()
    assert wd.loads(counter) == 10
    assert worker.stats()["resident_bytes"] == 0


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_children_share_one_cache_and_its_counters(tmp_path, method):
    counter = str(tmp_path / "loads")
    cache = PreloadCache(functools.partial(wd.square, counter), max_memory_size=1 << 20)
    ctx = multiprocessing.get_context(method)
    # One pool process: both tasks unpickle their own copy of the cache in the same process,
    # and the owner's counters must see both copies' counts.
    with ctx.Pool(1) as pool:
        first = pool.apply(wd.cache_worker_stats, (cache, list(range(10))))
        second = pool.apply(wd.cache_worker_stats, (cache, list(range(20))))
    assert first["owner"] is False and second["owner"] is False
    assert first["values"] == [k * k for k in range(10)]
    assert second["values"] == [k * k for k in range(20)]
    assert wd.loads(counter) == 20  # the second child found the first one's items
    stats = cache.stats()
    assert stats["hits"] == 10 and stats["misses"] == 20 and stats["loads"] == 20
    assert stats["resident_bytes"] == sum(item_files(str(cache._store.path)).values())
    assert stats["resident_bytes"] <= stats["max_memory_size"]
    path = cache._store.path
    del cache, first, second
    import gc

    gc.collect()
    assert not os.path.exists(path)


def test_children_share_a_cache_that_holds_part_of_the_items(tmp_path):
    counter = str(tmp_path / "loads")
    budget = 5 * item_size(0)
    cache = PreloadCache(functools.partial(wd.square, counter), max_memory_size=budget)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        runs = [pool.apply_async(wd.cache_worker, (cache, list(range(12)))) for _ in range(3)]
        values = [r.get(timeout=300) for r in runs]
    assert values == [[float(k * k) for k in range(12)]] * 3
    files = item_files(cache._store.path)
    assert len(files) == 5 and cache.stats()["resident_bytes"] == sum(files.values()) <= budget
    cache._finalizer()


def test_stale_leftovers_do_not_count_as_items(store):
    with open(os.path.join(store.path, "i7.tmp99999"), "wb") as f:
        f.write(b"partial")
    assert store.files() == 0 and store.read(7) == (False, None)
    assert store.write(7, np.zeros(ITEM)) and store.files() == 1
    shutil.rmtree(store.path)
    assert store.read(7) == (False, None) and not store.write(8, 1) and store.used == 0


def test_many_copies_of_a_worker_in_one_process_hold_one_stats_file(tmp_path):
    # A process pool unpickles the cache for every task: each copy's counts add up, and the
    # copies do not each keep a file open (a leak of one descriptor per task).
    load = functools.partial(wd.square, str(tmp_path / "loads"))
    owner = PreloadCache(load, max_memory_size=1 << 20, threads=0)
    path = owner.share()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        counts = pool.apply(wd.copies_in_one_process, (owner, 200))
    assert counts["fds_opened"] <= 2
    stats = owner.stats()
    assert stats["misses"] == 10 and stats["hits"] == 190 and stats["loads"] == 10
    assert [n for n in os.listdir(path) if n.startswith("stats-")] == [f"stats-{counts['pid']}"]
    owner._finalizer()


@settings(max_examples=40)
@given(
    limit=st.integers(0, 20_000),
    writes=st.lists(st.tuples(st.integers(0, 15), st.integers(0, 600)), max_size=30),
)
def test_writes_are_admitted_exactly_when_new_and_within_the_budget(limit, writes):
    store = SharedStore.create(limit, 0)
    try:
        held: dict[int, int] = {}
        for key, size in writes:
            item = np.arange(size, dtype=np.float64)
            n = charged(len(pickle.dumps(item, protocol=5)))
            fits = key not in held and sum(held.values()) + n <= limit
            assert store.write(key, item) is fits
            if fits:
                held[key] = n
            files = item_files(store.path)
            assert store.used == sum(files.values()) == sum(held.values()) <= limit
            assert set(files) == {f"i{k}" for k in held}
        for key in held:
            found, item = store.read(key)
            assert found and np.array_equal(item, np.arange(len(item), dtype=np.float64))
    finally:
        store.remove()


@settings(max_examples=25, deadline=None)
@given(
    records=st.lists(st.tuples(*[st.integers(0, 2**40)] * 5), max_size=4), holes=st.integers(0, 3)
)
def test_counters_sum_each_readable_file_once_and_skip_the_unreadable(records, holes):
    """A counters file that cannot be read (gone, or not a file) counts zero; every other
    file counts exactly once (a failed read once reused the previous file's bytes)."""
    from dualtrain.preload import shared

    store = SharedStore.create(1 << 20, 0)
    try:
        for i, record in enumerate(records):  # pids no process has: never this one's
            path = os.path.join(store.path, f"{shared._STATS}{10**9 + i}")
            with open(path, "wb") as f:
                f.write(shared._RECORD.pack(*record))
        for i in range(holes):  # opening a directory fails with an OSError
            os.mkdir(os.path.join(store.path, f"{shared._STATS}{2 * 10**9 + i}"))
        want = [sum(column) for column in zip(*records, strict=True)] if records else [0] * 5
        assert list(store.counters().values()) == want
    finally:
        store.remove()


def test_a_dropped_shared_cache_keeps_its_folder_until_its_loads_ahead_end():
    """Loads ahead in flight keep a dropped cache's folder: it goes when the last one ends
    (removed under a writer, a late item file kept the folder in /dev/shm for good)."""
    import gc
    import threading

    started, release = threading.Event(), threading.Event()

    def load(key):
        started.set()
        release.wait(30)
        return np.full(ITEM, key, dtype=np.float64)

    cache = PreloadCache(load, max_memory_size=1 << 22, preloaded_data=2, threads=1)
    path = cache.share()
    cache.expect([0, 1])
    assert started.wait(30)
    pool = cache.loader.executor()
    del cache
    gc.collect()
    assert os.path.isdir(path), "the folder went while a load ahead was writing to it"
    release.set()
    pool.shutdown(wait=True)
    gc.collect()
    assert not os.path.exists(path)
