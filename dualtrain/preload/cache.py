"""The preload cache: items by key within a byte budget, loaded ahead in the order of use.

One `PreloadCache` serves `get(key)` for a loader ``load(key) -> item``. What it holds:

- **ahead** items: loaded by its threads for keys the plan (`expect`) says come next;
  never evicted while they are in the window of the next `preloaded_data` keys.
- **kept** items: served already, kept for later epochs while the budget allows.

Every admission goes through a ledger, so the bytes held (`resident_bytes`, counted by
`dualtrain.preload.sizes.nbytes`) never pass `max_memory_size`. An item loaded ahead that
does not fit evicts kept items that are not in the window, the most recently used first
(for a loop over the same items that is what keeps the most of them: least-recently-used
would evict each just before its turn comes back); an item the consumer had to load itself
is kept only if it fits in the free bytes. When the window alone fills the budget, loading
ahead stops until the consumer catches up (back-pressure). An item larger than the budget
is served and not kept. Loader threads hold at most `threads` items on top of the budget
between loading one and admitting it.

In a worker process (forked, or unpickled from a cache that was shared) the cache uses its
shared folder (`dualtrain.preload.shared`) against the same budget and loads nothing ahead:
the DataLoader's or Tank's workers are the parallelism there.

The cache holds its parts, each owning its state: the plan's `Window` (the held items, their
admission and eviction, `dualtrain.preload.window`), the `Loader` (the source's calls and the
loader threads, `dualtrain.preload.loader`) and, once shared, its folder (`SharedStore`);
`dualtrain.preload.forks` pauses and shares it around a fork. This module is the consumer's
side, and the processes'.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import CancelledError, Future
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.preload import forks, shared
from dualtrain.preload.budget import LocalLedger, check_budget
from dualtrain.preload.copies import fresh
from dualtrain.preload.loader import Loader
from dualtrain.preload.window import Window

__all__ = ["PreloadCache", "check_count"]

# The counters `stats` reports: the consumer's (hits, waits, misses, and items the shared
# folder did not keep), the window's (refused and evicted) and the loader's (loads).
COUNTS = (
    "hits", "prefetch_waits", "misses", "loads", "evictions", "dropped", "not_kept",
    "data_wait_ns",
)  # fmt: skip


def check_count(name: str, value: object, low: int) -> int:
    """`value` as an int >= `low` (NumPy ints taken, bools refused), else ArgumentError."""
    number = int(value) if isinstance(value, np.integer) else value
    if isinstance(number, bool) or not isinstance(number, int) or number < low:
        raise bad_argument(name, value, f"an int >= {low}")  # the value as given
    return number


class PreloadCache:
    """Items of ``load(key)`` held within `max_memory_size` bytes and loaded ahead.

    Args:
        load: ``load(key) -> item``; its errors reach the caller of `get` with the key named.
        max_memory_size: the budget in bytes; None: `DEFAULT_FRACTION` of the memory
            available now (`dualtrain.preload.budget`).
        preloaded_data: the window: how many upcoming keys of the plan are loaded ahead.
        threads: loader threads; None: ``min(preloaded_data, os.cpu_count())``; 0 loads
            nothing ahead.
        copy: hits return `fresh` copies (True), so changing an item in place never changes
            the cache; False returns the held object itself.
        sizeof: ``sizeof(obj) -> int | None`` for objects `nbytes` cannot see into.
        shareable: share the items with forked and spawned worker processes.
        pin: ``pin(item) -> item`` applied before an item is held (pinned staging).
        shared_path: (internal) the shared folder of the cache this one is a worker of.
    """

    def __init__(
        self,
        load: Callable[[Any], Any],
        *,
        max_memory_size: int | None = None,
        preloaded_data: int = 20,
        threads: int | None = None,
        copy: bool = True,
        sizeof: Callable[[Any], int | None] | None = None,
        shareable: bool = True,
        pin: Callable[[Any], Any] | None = None,
        shared_path: str | None = None,
    ) -> None:
        if not callable(load):
            raise bad_argument("load", load, "a callable load(key) -> item")
        self.max_memory_size = check_budget(max_memory_size)
        self.preloaded_data = check_count("preloaded_data", preloaded_data, 0)
        if threads is None:
            threads = min(self.preloaded_data, os.cpu_count() or 1)
        self.threads = check_count("threads", threads, 0)
        if not isinstance(copy, bool):
            raise bad_argument("copy", copy, "a bool")
        if sizeof is not None and not callable(sizeof):
            raise bad_argument("sizeof", sizeof, "a callable sizeof(obj) -> int | None, or None")
        self._load, self.copy, self._sizeof, self._pin = load, copy, sizeof, pin
        self._shareable = bool(shareable)
        self._store: shared.SharedStore | None = None  # the shared folder, once there is one
        self._finalizer: weakref.finalize[Any, Any] | None = None  # removes it
        self._start_runtime(worker_of=shared_path)

    # -- process bookkeeping ---------------------------------------------------------------

    def _start_runtime(self, worker_of: str | None) -> None:
        """This process's parts (one per process): a worker's of the folder `worker_of`."""
        self._pid = os.getpid()
        self._owner = worker_of is None  # this process owns the items (not a worker's copy)
        self._cond = threading.Condition()  # the one lock of the cache and its parts
        self._served: collections.Counter[str] = collections.Counter()  # the consumer's counts
        if worker_of is not None and not os.path.isdir(worker_of):
            worker_of = None  # its owner is gone (a cache pickled in an earlier run): own one
            self._owner, self._store = True, None
        ledger: LocalLedger | shared.SharedStore
        if worker_of is not None:
            self._store = ledger = shared.SharedStore(worker_of, self.max_memory_size)
        else:
            ledger = LocalLedger(self.max_memory_size)
            forks.LIVE.add(self)
        self.window = Window(self.preloaded_data, ledger)
        self.loader = Loader(
            self._load, threads=self.threads, sizeof=self._sizeof, pin=self._pin,
            cond=self._cond, window=self.window, store=self._store,
        )  # fmt: skip

    def _check_process(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the parent's threads and locks are gone
            path = self._store.path if self._store is not None else None
            self._start_runtime(worker_of=path)

    def _settings(self) -> dict[str, Any]:
        return {
            "load": self._load, "max_memory_size": self.max_memory_size,
            "preloaded_data": self.preloaded_data, "threads": self.threads,
            "copy": self.copy, "sizeof": self._sizeof, "shareable": self._shareable,
            "pin": self._pin,
        }  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for a worker process: the copy joins this cache's shared folder.
        path = self.share() if self._owner else self._store.path if self._store else None
        return {**self._settings(), "shared_path": path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __copy__(self) -> PreloadCache:
        """A new, empty cache with the same settings (a copy never shares its items)."""
        return PreloadCache(**self._settings())

    def __deepcopy__(self, memo: dict[int, Any]) -> PreloadCache:
        """A new, empty cache with the same settings and a deep copy of `load`."""
        import copy

        return PreloadCache(**{**self._settings(), "load": copy.deepcopy(self._load, memo)})

    # -- forks (`dualtrain.preload.forks`) ------------------------------------------------

    def before_fork(self) -> None:
        """Before this process forks: source calls paused, and owned items shared."""
        if self._owner and self._shareable and self._pid == os.getpid():
            self.loader.pause()
            self.share()

    def after_fork(self) -> None:
        """In the parent, after a fork: source calls go on."""
        if self._pid == os.getpid():
            self.loader.resume()

    # -- the consumer's side ---------------------------------------------------------------

    def get(self, key: Hashable) -> Any:
        """The item of `key`: held, being loaded (waited for), or loaded now."""
        self._check_process()
        if not self._owner:
            return self._get_shared(key)
        start = time.perf_counter()
        with self._cond:
            self.window.advance(key)
            self.loader.asked(key)
            entry = self.window.items.get(key)
            if entry is not None:
                self.window.serve(key, entry)
                self._served["hits"] += 1
                self.loader.pump()
                item = entry.item
                return fresh(item) if self.copy else item
            # Loaded here if no load is under way; others asking meanwhile wait for this one.
            future, mine = self.loader.join(key)
        if mine:
            item, kept, found = self._load_now(key, future)
        else:
            try:
                item, kept = self._wait(key, future)
            except CancelledError:  # `close` cancelled that load ahead before it ran
                return self.get(key)
            found = False
        with self._cond:
            what = "hits" if found else "misses" if mine else "prefetch_waits"
            self._served[what] += 1
            if not found:
                self._served["data_wait_ns"] += int((time.perf_counter() - start) * 1e9)
        if found:  # read from the shared folder: a new object already
            return item
        # An item another caller also received, or one the cache holds, is copied.
        shared_item = (kept and self._store is None) or not mine
        return fresh(item) if self.copy and shared_item else item

    def get_many(self, keys: Iterable[Hashable]) -> list[Any]:
        """The items of `keys`, in order; the missing ones loaded in parallel by the threads.

        Each load's item goes straight to this caller, kept or not, so an item the budget
        cannot keep is still loaded once.
        """
        keys = list(keys)
        self._check_process()
        if not (self._owner and self.threads):
            return [self.get(key) for key in keys]
        mine: dict[Hashable, Future[tuple[Any, bool]]] = {}
        with self._cond:
            for key in dict.fromkeys(keys):
                if key in self.window.items or key in self.loader.loading:
                    continue
                if self._store is not None and self._store.has(key):
                    continue
                mine[key] = self.loader.join(key)[0]  # a new load: none is under way
            pool = self.loader.executor()
        for key, started in mine.items():
            try:
                task = pool.submit(self._load_into, key, started)
            except RuntimeError:  # `close` shut the pool down meanwhile: not loaded here
                self._abandon(key, started, None)
                continue
            task.add_done_callback(functools.partial(self._abandon, key, started))
        out: list[Any] = []
        done: dict[Hashable, tuple[Any, bool]] = {}  # this batch's own loads, for repeats
        repeats = collections.Counter(keys)
        for key in keys:
            own_load = mine.pop(key, None)
            if own_load is None and key in done and not done[key][1]:
                with self._cond:  # asked again in this batch, and not kept: not loaded twice
                    self._served["hits"] += 1
                out.append(fresh(done[key][0]) if self.copy else done[key][0])
                continue
            if own_load is None:  # held, loaded by another, or asked twice in this batch
                out.append(self.get(key))
                continue
            start = time.perf_counter()
            try:
                item, kept = own_load.result()  # the load's error, its key named
            except CancelledError:  # `close` cancelled the load before it ran
                out.append(self.get(key))
                continue
            with self._cond:
                self.window.advance(key)
                self._served["prefetch_waits"] += 1  # loaded by the threads, in parallel
                self._served["data_wait_ns"] += int((time.perf_counter() - start) * 1e9)
            held = kept and self._store is None
            done[key] = (item, kept)
            out.append(fresh(item) if self.copy and (held or repeats[key] > 1) else item)
        return out

    def _abandon(self, key: Hashable, future: Future[Any], task: Future[Any] | None) -> None:
        """A `get_many` load that `close` cancelled (or never let start): its waiters load it."""
        if task is not None and not task.cancelled():
            return
        with self._cond:
            self.loader.forget(key, future)
        future.cancel()

    def _load_into(self, key: Hashable, future: Future[tuple[Any, bool]]) -> None:
        """`_load_now` in a loader thread, for `get_many` (its future carries the result)."""
        with contextlib.suppress(BaseException):  # the future carries the error
            self._load_now(key, future)

    def expect(self, keys: Iterable[Hashable], *, cyclic: bool = False) -> None:
        """Says the next keys asked for are `keys`, in this order (replacing earlier plans).

        The threads load the first `preloaded_data` of them ahead and move along the plan as
        its keys are asked for. `cyclic`: the plan repeats (an order every epoch follows).
        """
        self._check_process()
        plan = list(keys)
        if not self._owner:
            return  # a worker process: the DataLoader's or Tank's workers load ahead
        with self._cond:
            # Keys dropped for want of room stay skipped until served (a Tank re-plans every
            # batch: clearing them here would load them again at every batch).
            self.window.expect(plan, cyclic)
            self.loader.rewind()
            self.loader.pump()

    def stats(self) -> dict[str, Any]:
        """Counters and bytes.

        Keys: ``hits`` (served from memory at once), ``prefetch_waits`` (waited for an item
        being loaded ahead), ``misses`` (loaded by the caller), ``loads`` (calls of `load`),
        ``evictions``, ``dropped`` (loaded ahead but no room), ``not_kept`` (served, not
        kept: no room), ``items`` and ``local_bytes`` (held by this process),
        ``resident_bytes`` (held by every process sharing the cache),
        ``peak_resident_bytes``, ``max_memory_size``, ``data_wait_s`` (time `get` waited
        for items not in memory) and ``hit_rate`` (hits over gets). Shared with worker
        processes, the workers' counts are added in.
        """
        self._check_process()
        with self._cond:
            counts = self._counts
            local = sum(e.size for e in self.window.items.values())
            items = len(self.window.items)
        if self._owner and self._store is not None:
            counts.update(self._store.counters())
        gets = counts["hits"] + counts["prefetch_waits"] + counts["misses"]
        resident = self.window.ledger.used
        return {
            "hits": counts["hits"], "prefetch_waits": counts["prefetch_waits"],
            "misses": counts["misses"], "loads": counts["loads"],
            "evictions": counts["evictions"], "dropped": counts["dropped"],
            "not_kept": counts["not_kept"], "items": items, "local_bytes": local,
            "resident_bytes": resident, "peak_resident_bytes": max(self.window.peak, resident),
            "max_memory_size": self.max_memory_size,
            "data_wait_s": counts["data_wait_ns"] / 1e9,
            "hit_rate": counts["hits"] / gets if gets else 0.0,
        }  # fmt: skip

    def clear(self) -> None:
        """Drops every held item, in this process and in the shared folder (every process)."""
        self._check_process()
        with self._cond:
            self.window.clear()
            self.loader.rewind()
        if self._store is not None:
            self._store.clear()

    def close(self) -> None:
        """Stops the loader threads (held items stay; a later `get` starts them again)."""
        with self._cond:
            pool = self.loader.stop()
            self.window.expect([], cyclic=False)
            self.loader.rewind()
        if pool is not None and os.getpid() == self._pid:
            pool.shutdown(wait=True, cancel_futures=True)

    # -- the consumer's loads ------------------------------------------------------------

    def _wait(self, key: Hashable, future: Future[tuple[Any, bool]]) -> tuple[Any, bool]:
        item, kept = future.result()
        with self._cond:
            entry = self.window.items.get(key)
            if entry is not None:
                self.window.serve(key, entry)
                item, kept = entry.item, True
            self.loader.pump()
        return item, kept

    def _load_now(self, key: Hashable, future: Future[tuple[Any, bool]]) -> tuple[Any, bool, bool]:
        """Loads `key` for the caller: (item, kept, found in the shared folder)."""
        try:
            found, item = self._store.read(key) if self._store is not None else (False, None)
            size = 0
            if not found:
                # Counted with the load: a bad sizeof reaches the caller and every waiter.
                item, size = self.loader.sized(key)
        except BaseException as e:
            with self._cond:
                self.loader.finish(key)
            future.set_exception(e)
            raise
        if found:
            kept = True
        elif self._store is not None:
            kept = self._store.write(key, item)
            if not kept:
                self._served["not_kept"] += 1
        with self._cond:
            waiting = self.loader.finish(key)
            if self._store is None:
                kept = self.window.admit(key, item, size, ahead=False)
            self.loader.pump()
        # The item comes back to this caller uncopied, who may change it as soon as `get`
        # returns: those waiting for it copy a copy made now.
        given = (
            fresh(item) if waiting and self.copy and (found or not kept or self._store) else item
        )
        future.set_result((given, kept))
        return item, kept, found

    # -- sharing with worker processes -----------------------------------------------------

    def share(self) -> str | None:
        """Makes (once) the shared folder worker processes use; returns its path.

        Held items move into the folder (as the workers' are), so every process sees one
        copy of each within the one budget; from then on this process keeps its items there
        too, and loads ahead into it. None where the cache is not shareable.
        """
        if not self._shareable:
            return None
        if self._store is None:
            with self._cond:
                if self._store is None:
                    store = shared.SharedStore.create(self.max_memory_size, 0)
                    self.window.share(store)  # what does not fit is dropped
                    self.loader.share(store)
                    self._store = store
                    # Tied to the loader, which each load ahead in flight holds: a cache
                    # dropped mid-load keeps its folder until the last of them ends.
                    self._finalizer = weakref.finalize(self.loader, store.remove)
        return self._store.path

    def _get_shared(self, key: Hashable) -> Any:
        """A worker process's `get`: through the shared folder, loading what is not there."""
        assert self._store is not None
        start = time.perf_counter()
        found, item = self._store.read(key)
        if found:
            self._served["hits"] += 1
        else:
            item = self.loader.call(key)
            if not self._store.write(key, item):
                self._served["not_kept"] += 1
            self._served["misses"] += 1
            self._served["data_wait_ns"] += int((time.perf_counter() - start) * 1e9)
        self._store.record(self._counts)
        return item

    # -- counters -------------------------------------------------------------------------

    @property
    def _counts(self) -> collections.Counter[str]:
        """This process's counters: the consumer's, its window's and its loader's."""
        parts = (self._served, self.window.counts, self.loader.counts)
        return collections.Counter({k: sum(p[k] for p in parts) for k in COUNTS})

    # What the tests look into, each owned by a part.
    _items = property(lambda self: self.window.items)
    _ledger = property(lambda self: self.window.ledger)
    _loading = property(lambda self: self.loader.loading)
    _waiting = property(lambda self: self.loader.waiting)
    _reserved = property(lambda self: self.loader.reserved)
