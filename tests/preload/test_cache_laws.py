"""Laws of PreloadCache: the byte budget after every step, items unchanged, the real order.

The cache's threads make timing nondeterministic, so the laws are checked under the cache's
lock at any moment; where a test needs determinism it waits until nothing is being loaded
(`settle`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dualtrain.errors import ArgumentError
from dualtrain.preload.cache import PreloadCache
from dualtrain.preload.sizes import nbytes, own
from tests.preload.test_sizes import assert_same

# Mutable kinds twice as often: they are the ones a consumer could change in the cache.
KINDS = ("array", "nested", "array", "nested", "bytes", "str")


class BoomError(Exception):
    """What the test source raises for a failing key."""


class Source:
    """``load(key)``: a new item built from the key's (kind, size) on every call; calls recorded."""

    def __init__(self, specs: dict[int, tuple[str, int]], delay: float = 0.0) -> None:
        self.specs = specs
        self.delay = delay
        self.failing: set[int] = set()
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def make(self, key: int) -> Any:
        kind, n = self.specs[key]
        if kind == "array":
            return np.arange(n, dtype=np.float64) + key
        if kind == "bytes":
            return bytes([key % 256]) * n
        if kind == "str":
            return f"{key}:" + "x" * n
        return {"key": key, "row": np.full(n, key, np.int32), "meta": [f"k{key}", (key, b"z" * n)]}

    def __call__(self, key: int) -> Any:
        with self.lock:
            self.calls.append(key)
        if self.delay:
            time.sleep(self.delay)
        if key in self.failing:
            raise BoomError(f"no item {key}")
        return self.make(key)

    def count(self, key: int) -> int:
        with self.lock:
            return self.calls.count(key)


def arrays_source(n: int, length: int = 100, delay: float = 0.0) -> Source:
    return Source(dict.fromkeys(range(n), ("array", length)), delay=delay)


def item_bytes(source: Source, key: int) -> int:
    return nbytes(own(source.make(key)))


# Deadlines for what the cache's threads do: generous, since the machine may be busy; each
# wait ends as soon as its condition holds.
PATIENCE = 120.0


def settle(cache: PreloadCache, timeout: float = PATIENCE) -> None:
    """Waits until the cache loads nothing (its threads may start more as others finish)."""
    deadline = time.monotonic() + timeout
    while True:
        with cache._cond:
            if not cache._loading:
                return
        assert time.monotonic() < deadline, "the cache kept loading"
        time.sleep(0.001)


def wait_until(condition: Any, what: str, timeout: float = PATIENCE) -> None:
    """Polls `condition` until it holds (the threads run when the machine lets them)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.0005)


def array_leaves(obj: Any) -> list[np.ndarray]:
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [a for x in obj for a in array_leaves(x)]
    return []


def mutate(obj: Any) -> None:
    """Changes every array, list and dict of `obj` in place (what a consumer may do)."""
    if isinstance(obj, np.ndarray):
        obj += 1
    elif isinstance(obj, dict):
        for v in obj.values():
            mutate(v)
        obj["mutated"] = True
    elif isinstance(obj, list):
        for v in obj:
            mutate(v)
        obj.append("mutated")


# -- the state machine ------------------------------------------------------------------------


class CacheMachine(RuleBasedStateMachine):
    """Random sources, budgets, windows and threads; random gets, batches, plans and clears."""

    @initialize(data=st.data())
    def build(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(1, 10), label="n")
        spec = st.tuples(st.sampled_from(KINDS), st.integers(0, 200))
        specs = data.draw(st.lists(spec, min_size=n, max_size=n), label="specs")
        # A slow source now and then, so the consumer races the threads loading ahead.
        delay = data.draw(st.sampled_from([0.0, 0.0003]), label="delay")
        self.source = Source(dict(enumerate(specs)), delay=delay)
        sizes = [item_bytes(self.source, k) for k in range(n)]
        kinds = ["zero", "under_one", "some", "some", "all", "all"]  # mostly room for some hits
        kind = data.draw(st.sampled_from(kinds), label="budget")
        if kind == "zero":
            budget = 0
        elif kind == "under_one":
            budget = data.draw(st.integers(0, min(sizes) - 1))
        elif kind == "some":
            budget = data.draw(st.integers(min(sizes), sum(sizes)))
        else:
            budget = sum(sizes) + data.draw(st.integers(0, 1000))
        self.budget = budget
        self.cache = PreloadCache(
            self.source,
            max_memory_size=budget,
            preloaded_data=data.draw(st.integers(0, 6), label="preloaded_data"),
            threads=data.draw(st.integers(0, 3), label="threads"),
        )
        self.n = n
        self.gets = 0

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            self.cache.close()

    def _served(self, key: int, item: Any) -> None:
        """The law of every item served: the source's value, sharing no memory with the cache."""
        self.gets += 1
        assert_same(item, self.source.make(key))
        with self.cache._cond:
            held = [a for e in self.cache._items.values() for a in array_leaves(e.item)]
        for a in array_leaves(item):
            assert not any(np.shares_memory(a, h) for h in held)
        mutate(item)  # the invariant then checks every held item is still the source's

    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        key = data.draw(st.integers(0, self.n - 1), label="key")
        self._served(key, self.cache.get(key))

    @rule(data=st.data())
    def get_many(self, data: st.DataObject) -> None:
        keys = data.draw(st.lists(st.integers(0, self.n - 1), max_size=6), label="batch")
        items = self.cache.get_many(keys)
        assert len(items) == len(keys)
        for key, item in zip(keys, items, strict=True):
            self._served(key, item)

    @rule(data=st.data(), cyclic=st.booleans())
    def expect(self, data: st.DataObject, cyclic: bool) -> None:
        keys = st.integers(0, self.n - 1)
        order = data.draw(st.permutations(range(self.n)) | st.lists(keys, max_size=12))
        self.cache.expect(order, cyclic=cyclic)

    @rule()
    def clear(self) -> None:
        self.cache.clear()

    @rule()
    def wait_until_idle(self) -> None:
        settle(self.cache)
        assert self.cache.stats()["loads"] == len(self.source.calls)

    @invariant()
    def within_budget_and_unchanged(self) -> None:
        cache = self.cache
        with cache._cond:
            entries = dict(cache._items)
            used = cache._ledger.used
            loads = cache._counts["loads"]
            calls = len(self.source.calls)
            in_flight = len(cache._loading)
        assert used <= self.budget
        assert used == sum(e.size for e in entries.values())
        for key, entry in entries.items():
            assert entry.size == nbytes(entry.item)
            assert_same(entry.item, self.source.make(key))
        # Each load is counted before the source is called, and leaves `_loading` after.
        assert calls <= loads <= calls + in_flight
        stats = cache.stats()
        assert stats["resident_bytes"] <= stats["max_memory_size"] == self.budget
        assert stats["peak_resident_bytes"] <= self.budget
        assert stats["hits"] + stats["prefetch_waits"] + stats["misses"] == self.gets


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=30, stateful_step_count=20, deadline=None)


# -- examples ----------------------------------------------------------------------------------


def shuffled(n: int, seed: int = 3) -> list[int]:
    return [int(k) for k in np.random.default_rng(seed).permutation(n)]


@pytest.mark.parametrize("threads", [0, 2])
def test_hit_rate_is_one_with_a_known_order_when_the_data_fits(threads: int) -> None:
    n = 30
    source = arrays_source(n)
    cache = PreloadCache(source, max_memory_size=n * item_bytes(source, 0), threads=threads,
                         preloaded_data=5)  # fmt: skip
    order = shuffled(n)
    cache.expect(order, cyclic=True)
    for epoch in range(3):
        before = cache.stats()
        for key in order:
            np.testing.assert_array_equal(cache.get(key), source.make(key))
        after = cache.stats()
        if epoch:
            assert after["hits"] - before["hits"] == n
            assert after["loads"] == before["loads"] == n
    assert cache.stats()["evictions"] == 0
    cache.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_prefetch_loads_the_window_of_the_order_given(threads: int) -> None:
    n, window = 40, 5
    source = arrays_source(n)
    cache = PreloadCache(source, max_memory_size=10**6, preloaded_data=window, threads=threads)
    order = shuffled(n)
    cache.expect(order)
    settle(cache)
    assert set(source.calls) == set(order[:window])
    for i, key in enumerate(order[:20]):
        cache.get(key)
        settle(cache)
        assert set(source.calls) == set(order[: i + 1 + window])
        guess = set(range(key + 1, key + 1 + window)) - set(order[: i + 1 + window])
        assert not guess & set(source.calls)  # never index+1..+k
        if threads == 1:
            assert source.calls == order[: i + 1 + window]  # one thread: in the order's sequence
    assert cache.stats()["hits"] == 20
    cache.close()


def test_prefetch_stays_in_the_window_while_the_consumer_runs() -> None:
    n, window = 60, 4
    source = arrays_source(n, delay=0.0005)
    cache = PreloadCache(source, max_memory_size=10**6, preloaded_data=window, threads=3)
    order = shuffled(n, seed=11)
    cache.expect(order)
    for i, key in enumerate(order):
        cache.get(key)
        with cache._cond, source.lock:
            assert set(source.calls) <= set(order[: i + 1 + window])
    cache.close()


@pytest.mark.parametrize(("threads", "wait"), [(0, False), (2, False), (2, True)])
def test_a_cyclic_scan_larger_than_the_budget_keeps_a_stable_set(threads: int, wait: bool) -> None:
    n, fits, window = 40, 10, 4
    source = arrays_source(n)
    budget = fits * item_bytes(source, 0)
    cache = PreloadCache(source, max_memory_size=budget, preloaded_data=window, threads=threads)
    order = shuffled(n)
    cache.expect(order, cyclic=True)
    for _ in range(2):
        for key in order:
            cache.get(key)
    settle(cache)
    before = cache.stats()
    for key in order:
        cache.get(key)
        if wait:  # the loads ahead keep up with the consumer: deterministic
            settle(cache)
        assert cache.stats()["resident_bytes"] <= budget
    settle(cache)
    after = cache.stats()
    hit_rate = (after["hits"] - before["hits"]) / n
    assert hit_rate >= (fits - window) / n  # least-recently-used would keep nothing: ~0
    # The items kept across epochs are not loaded again (least-recently-used loads all n);
    # which item a load ahead evicts depends on timing by one item or so per thread.
    stable = fits - window if wait or not threads else fits - window - threads
    assert after["loads"] - before["loads"] <= n - stable
    cache.close()


def test_back_pressure_stops_loading_at_the_budget() -> None:
    n, fits, threads = 40, 5, 2
    source = arrays_source(n)
    budget = fits * item_bytes(source, 0)
    cache = PreloadCache(source, max_memory_size=budget, preloaded_data=20, threads=threads)
    cache.expect(range(n))
    settle(cache)
    loads = len(source.calls)
    assert loads <= fits + threads
    time.sleep(0.1)  # the consumer does nothing: nothing more is loaded
    settle(cache)
    assert len(source.calls) == loads
    stats = cache.stats()
    assert stats["resident_bytes"] <= budget and stats["peak_resident_bytes"] <= budget
    for key in range(10):  # the consumer catches up: loading ahead goes on, within the budget
        np.testing.assert_array_equal(cache.get(key), source.make(key))
        assert cache.stats()["resident_bytes"] <= budget
    settle(cache)
    assert cache.stats()["peak_resident_bytes"] <= budget
    cache.close()


@pytest.mark.parametrize("threads", [0, 2])
def test_an_item_larger_than_the_budget_is_served_and_not_kept(threads: int) -> None:
    source = Source({0: ("array", 10), 1: ("array", 1000), 2: ("array", 10)})
    budget = item_bytes(source, 0) + item_bytes(source, 2) + 10
    cache = PreloadCache(source, max_memory_size=budget, preloaded_data=3, threads=threads)
    cache.get(0)
    cache.expect([1, 2])
    settle(cache)
    np.testing.assert_array_equal(cache.get(1), source.make(1))
    settle(cache)
    stats = cache.stats()
    assert stats["not_kept"] + stats["dropped"] >= 1
    assert stats["dropped"] == (1 if threads else 0)
    assert 1 not in cache._items
    assert 0 in cache._items and stats["evictions"] == 0  # nothing evicted for a hopeless item
    assert stats["resident_bytes"] <= budget
    cache.close()


def test_items_loaded_ahead_are_evictable_once_no_plan_wants_them() -> None:
    # Regression: after expect([]) (or close()) the items loaded for the old plan stayed
    # "ahead" and could never be evicted, so nothing else could be held.
    source = arrays_source(20)
    fits = 5
    cache = PreloadCache(source, max_memory_size=fits * item_bytes(source, 0),
                         preloaded_data=fits, threads=2)  # fmt: skip
    cache.expect(range(fits))
    settle(cache)
    assert sorted(cache._items) == list(range(fits))
    cache.expect([])
    cache.expect([10, 11])  # loaded ahead, they make room by evicting the old plan's items
    settle(cache)
    for key in (10, 11):
        np.testing.assert_array_equal(cache.get(key), source.make(key))
    stats = cache.stats()
    # Both were held, each evicting an item (which ones depends on timing: an item just
    # served is the first evicted, so the second admitted may evict the first).
    assert stats["evictions"] == 2 and stats["dropped"] == 0
    assert {10, 11} & set(cache._items)
    cache.close()


@pytest.mark.parametrize("threads", [0, 2])
def test_a_source_error_names_the_key_and_is_retried(threads: int) -> None:
    source = arrays_source(8)
    source.failing.add(3)
    cache = PreloadCache(source, max_memory_size=10**6, preloaded_data=4, threads=threads)
    cache.expect(range(8))
    for key in range(3):
        cache.get(key)
        settle(cache)
    # Regression: a failing load ahead was started again on every step of the consumer.
    assert source.count(3) <= 1
    with pytest.raises(BoomError) as info:
        cache.get(3)
    assert any("item 3" in note for note in info.value.__notes__)
    np.testing.assert_array_equal(cache.get(4), source.make(4))
    source.failing.clear()
    np.testing.assert_array_equal(cache.get(3), source.make(3))  # a later get tries again
    cache.close()


@pytest.mark.parametrize("fits", [True, False])
def test_concurrent_gets_of_one_key_load_it_once(fits: bool) -> None:
    source = arrays_source(4)
    release = threading.Event()
    started: list[int] = []

    def load(key: int) -> Any:
        started.append(key)
        release.wait(PATIENCE)  # held until every caller is in `get`
        return source(key)

    cache = PreloadCache(load, max_memory_size=10**6 if fits else 0, threads=0)
    results: list[Any] = []

    def ask() -> None:
        results.append(cache.get(2))

    workers = [threading.Thread(target=ask) for _ in range(6)]
    for w in workers:
        w.start()
    try:
        # Every caller is in `get`: loading (once, or more if the law is broken) or waiting
        # for that load. Only then may the load end, so no caller comes after it.
        wait_until(lambda: len(started) + cache._waiting[2] == 6, "six callers in get")
    finally:
        release.set()
    for w in workers:
        w.join()
    assert source.count(2) == 1
    assert len(results) == 6
    for i, a in enumerate(results):
        np.testing.assert_array_equal(a, source.make(2))
        assert not any(np.shares_memory(a, b) for b in results[i + 1 :])


@pytest.mark.parametrize("attempt", range(3))
def test_a_caller_waiting_on_another_callers_load_gets_the_item_unchanged(attempt: int) -> None:
    # Regression: an item not kept went uncopied to the caller that loaded it, and those
    # waiting on that load copied it later: after that caller had changed it.
    release = threading.Event()

    def load(key: int) -> np.ndarray:
        release.wait(PATIENCE)
        return np.zeros(1_000_000)

    cache = PreloadCache(load, max_memory_size=0, threads=0)  # nothing is kept
    got: dict[str, np.ndarray] = {}

    def first() -> None:
        item = cache.get(0)
        item[:] = 1  # the caller changes its item as soon as it has it
        got["first"] = item

    def second() -> None:
        got["second"] = cache.get(0)

    loader = threading.Thread(target=first)
    loader.start()
    wait_until(lambda: 0 in cache._loading, "the first caller's load")
    waiter = threading.Thread(target=second)
    waiter.start()
    wait_until(lambda: cache._waiting[0], "the second caller to wait")
    release.set()
    loader.join()
    waiter.join()
    assert not got["second"].any()
    assert cache.stats()["loads"] == 1 and cache.stats()["prefetch_waits"] == 1


def test_a_hit_is_a_copy() -> None:
    source = Source({0: ("nested", 20)})
    cache = PreloadCache(source, max_memory_size=10**6, threads=0)
    first = cache.get(0)
    mutate(first)
    assert_same(cache.get(0), source.make(0))
    assert cache.stats()["hits"] == 1


def test_get_works_after_close() -> None:
    source = arrays_source(20)
    cache = PreloadCache(source, max_memory_size=10**6, preloaded_data=4, threads=2)
    cache.expect(range(20))
    for key in range(5):
        cache.get(key)
    cache.close()
    for key in range(20):
        np.testing.assert_array_equal(cache.get(key), source.make(key))
    cache.expect(range(20), cyclic=True)  # the threads start again
    cache.get(0)
    settle(cache)
    cache.close()


def test_close_forgets_loads_it_cancelled() -> None:
    # Regression: close() cancelled queued loads but left their futures behind, so a later
    # get of those keys raised CancelledError.
    release = threading.Event()
    source = arrays_source(4)
    plain = source.make

    def load(key: int) -> Any:
        if key == 0:
            release.wait(PATIENCE)
        return plain(key)

    cache = PreloadCache(load, max_memory_size=10**6, preloaded_data=4, threads=1)
    out: dict[str, Any] = {}

    def batch() -> None:
        try:
            out["items"] = cache.get_many([0, 1, 2, 3])
        except BaseException as e:
            out["error"] = e

    consumer = threading.Thread(target=batch)
    consumer.start()
    deadline = time.monotonic() + PATIENCE
    while len(cache._loading) < 4:  # 0 loading, 1..3 queued behind it
        assert time.monotonic() < deadline
        time.sleep(0.001)
    queued = [cache._loading[k] for k in (1, 2, 3)]
    closer = threading.Thread(target=cache.close)
    closer.start()
    while not all(f.cancelled() for f in queued):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    release.set()
    consumer.join()
    closer.join()
    assert "error" not in out, out
    for key, item in enumerate(out["items"]):
        np.testing.assert_array_equal(item, plain(key))
    assert not cache._loading and cache._reserved == 0


def test_a_caller_waiting_on_a_load_close_cancels_loads_it_itself() -> None:
    # Regression: the caller waiting on a queued load ahead got CancelledError from close().
    release = threading.Event()
    source = arrays_source(4)
    plain = source.make

    def load(key: int) -> Any:
        if key == 0:
            release.wait(PATIENCE)
        return plain(key)

    cache = PreloadCache(load, max_memory_size=10**6, preloaded_data=4, threads=1)
    out: dict[str, Any] = {}

    def batch() -> None:
        out["batch"] = cache.get_many([0, 1])

    def one() -> None:
        try:
            out["one"] = cache.get(1)
        except BaseException as e:
            out["error"] = e

    batcher = threading.Thread(target=batch)
    batcher.start()
    deadline = time.monotonic() + PATIENCE
    while len(cache._loading) < 2:  # 0 loading, 1 queued behind it
        assert time.monotonic() < deadline
        time.sleep(0.001)
    queued = cache._loading[1]
    waiter = threading.Thread(target=one)
    waiter.start()
    while not cache._waiting[1]:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    closer = threading.Thread(target=cache.close)
    closer.start()
    # The waiter, its queued load cancelled, loads key 1 itself while key 0 is still held.
    waiter.join(PATIENCE)
    assert not waiter.is_alive() and queued.cancelled()
    release.set()
    closer.join()
    batcher.join()
    assert "error" not in out, out
    np.testing.assert_array_equal(out["one"], plain(1))
    for key, item in enumerate(out["batch"]):
        np.testing.assert_array_equal(item, plain(key))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_memory_size", -1),
        ("max_memory_size", "1GB"),
        ("max_memory_size", 1.5),
        ("max_memory_size", True),
        ("preloaded_data", -1),
        ("preloaded_data", 2.0),
        ("threads", -1),
        ("threads", False),
        ("copy", "yes"),
        ("sizeof", 3),
    ],
)
def test_bad_arguments_are_named(name: str, value: object) -> None:
    with pytest.raises(ArgumentError, match=f"{name}={value!r}"):
        PreloadCache(arrays_source(1), **{name: value})


def test_load_must_be_callable() -> None:
    with pytest.raises(ArgumentError, match="load="):
        PreloadCache([1, 2, 3])  # type: ignore[arg-type]
