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
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.preload import shared
from dualtrain.preload.budget import LocalLedger, check_budget
from dualtrain.preload.copies import fresh
from dualtrain.preload.sizes import nbytes, own

__all__ = ["PreloadCache"]

Loader = Callable[[Any], Any]


@dataclasses.dataclass
class _Entry:
    item: Any
    size: int
    ahead: bool  # loaded for the plan and not served yet


def _check_count(name: str, value: object, low: int) -> int:
    if isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise bad_argument(name, value, f"an int >= {low}")
    return value


# Every live cache, so a fork shares them first (the child then finds their folder).
_LIVE: weakref.WeakSet[PreloadCache] = weakref.WeakSet()
# How long a fork waits for loads in flight (a source's lock held at the fork would stay
# held in the child for good): seconds.
_FORK_WAIT = 10.0


# Threads forking now: a fork does not wait for another thread's load that is itself a fork
# (a source that forks, in two loader threads at once, would make each wait for the other).
_forking: set[int] = set()


def _before_fork() -> None:
    _forking.add(threading.get_ident())
    for cache in list(_LIVE):
        if cache._owner and cache._shareable and cache._pid == os.getpid():
            cache._pause()
            cache.share()


def _after_fork_in_parent() -> None:
    _forking.discard(threading.get_ident())
    for cache in list(_LIVE):
        if cache._pid == os.getpid():
            cache._resume()


def _after_fork_in_child() -> None:
    _forking.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


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
        load: Loader,
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
        self.preloaded_data = _check_count("preloaded_data", preloaded_data, 0)
        if threads is None:
            threads = min(self.preloaded_data, os.cpu_count() or 1)
        self.threads = _check_count("threads", threads, 0)
        if not isinstance(copy, bool):
            raise bad_argument("copy", copy, "a bool")
        if sizeof is not None and not callable(sizeof):
            raise bad_argument("sizeof", sizeof, "a callable sizeof(obj) -> int | None, or None")
        self._load, self.copy, self._sizeof, self._pin = load, copy, sizeof, pin
        self._shareable = bool(shareable)
        self._store: shared.SharedStore | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._start_runtime(worker_of=shared_path)

    # -- process bookkeeping ---------------------------------------------------------------

    def _start_runtime(self, worker_of: str | None) -> None:
        self._pid = os.getpid()
        self._owner = worker_of is None
        self._cond = threading.Condition()
        self._items: dict[Hashable, _Entry] = {}
        self._kept: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self._ahead: set[Hashable] = set()
        self._dropped: set[Hashable] = set()  # loaded ahead without room: not again till served
        self._kept_bytes = 0
        self._loading: dict[Hashable, Future[tuple[Any, bool]]] = {}
        self._waiting = collections.Counter[Hashable]()  # callers waiting on a key's load
        self._plan: list[Hashable] = []
        self._at, self._cyclic = 0, False
        self._pool: ThreadPoolExecutor | None = None
        self._reserved = 0  # bytes set aside for items being loaded ahead
        self._sizes: collections.deque[int] = collections.deque(maxlen=16)  # recent items
        self._ahead_bytes = 0
        self._scan = 0  # plan position before which every key was seen to by `_pump`
        self._paused = 0  # forks under way: no source call starts while one is
        self._workers_checked, self._workers_seen = 0.0, False
        self._active: collections.Counter[int] = collections.Counter()  # threads in `load`
        self._counts = collections.Counter[str]()
        self._peak = 0
        if worker_of is not None and not os.path.isdir(worker_of):
            worker_of = None  # its owner is gone (a cache pickled in an earlier run): own one
            self._owner, self._store = True, None
        if worker_of is not None:
            self._store = shared.SharedStore(worker_of, self.max_memory_size)
            self._ledger: Any = self._store
        else:
            self._ledger = LocalLedger(self.max_memory_size)
            _LIVE.add(self)

    def _check_process(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the parent's threads and locks are gone
            path = self._store.path if self._store is not None else None
            self._start_runtime(worker_of=path)

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
                    for key, entry in self._items.items():
                        store.write(key, entry.item)  # what does not fit is dropped
                    self._items.clear()
                    self._kept.clear()
                    self._ahead.clear()
                    self._kept_bytes = self._ahead_bytes = 0
                    self._store, self._ledger = store, store
                    self._scan = self._at
                    self._finalizer = weakref.finalize(self, store.remove)
        return self._store.path

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

    # -- the consumer's side ---------------------------------------------------------------

    def get(self, key: Hashable) -> Any:
        """The item of `key`: held, being loaded (waited for), or loaded now."""
        self._check_process()
        if not self._owner:
            return self._get_shared(key)
        start = time.perf_counter()
        mine: Future[tuple[Any, bool]] | None = None
        with self._cond:
            self._advance(key)
            self._dropped.discard(key)
            entry = self._items.get(key)
            if entry is not None:
                self._serve(key, entry)
                self._counts["hits"] += 1
                self._pump()
                item = entry.item
                return fresh(item) if self.copy else item
            future = self._loading.get(key)
            if future is None:  # load it here; others asking meanwhile wait for this load
                future = mine = Future()
                self._loading[key] = mine
            else:
                self._waiting[key] += 1
        if mine is not None:
            item, kept, found = self._load_now(key, mine)
        else:
            try:
                item, kept = self._wait(key, future)
            except CancelledError:  # `close` cancelled that load ahead before it ran
                return self.get(key)
            found = False
        with self._cond:
            what = "hits" if found else "misses" if mine is not None else "prefetch_waits"
            self._counts[what] += 1
            if not found:
                self._counts["data_wait_ns"] += int((time.perf_counter() - start) * 1e9)
        if found:  # read from the shared folder: a new object already
            return item
        # An item another caller also received, or one the cache holds, is copied.
        shared_item = (kept and self._store is None) or mine is None
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
                if key in self._items or key in self._loading:
                    continue
                if self._store is not None and self._store.has(key):
                    continue
                mine[key] = self._loading[key] = Future()
            pool = self._executor()
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
                    self._counts["hits"] += 1
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
                self._advance(key)
                self._counts["prefetch_waits"] += 1  # loaded by the threads, in parallel
                self._counts["data_wait_ns"] += int((time.perf_counter() - start) * 1e9)
            held = kept and self._store is None
            done[key] = (item, kept)
            out.append(fresh(item) if self.copy and (held or repeats[key] > 1) else item)
        return out

    def _abandon(self, key: Hashable, future: Future[Any], task: Future[Any] | None) -> None:
        """A `get_many` load that `close` cancelled (or never let start): its waiters load it."""
        if task is not None and not task.cancelled():
            return
        with self._cond:
            if self._loading.get(key) is future:
                del self._loading[key]
                self._waiting.pop(key, None)
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
            self._plan, self._at, self._scan = plan, 0, 0
            self._cyclic = bool(cyclic) and bool(plan)
            self._demote_outside(set(self._window()))
            self._pump()

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
            counts = collections.Counter(self._counts)
            local = sum(e.size for e in self._items.values())
            items = len(self._items)
        if self._owner and self._store is not None:
            counts.update(self._store.counters())
        gets = counts["hits"] + counts["prefetch_waits"] + counts["misses"]
        resident = self._ledger.used
        return {
            "hits": counts["hits"], "prefetch_waits": counts["prefetch_waits"],
            "misses": counts["misses"], "loads": counts["loads"],
            "evictions": counts["evictions"], "dropped": counts["dropped"],
            "not_kept": counts["not_kept"], "items": items, "local_bytes": local,
            "resident_bytes": resident, "peak_resident_bytes": max(self._peak, resident),
            "max_memory_size": self.max_memory_size,
            "data_wait_s": counts["data_wait_ns"] / 1e9,
            "hit_rate": counts["hits"] / gets if gets else 0.0,
        }  # fmt: skip

    def clear(self) -> None:
        """Drops every held item, in this process and in the shared folder (every process)."""
        self._check_process()
        with self._cond:
            for entry in self._items.values():
                self._ledger.sub(entry.size)
            self._items.clear()
            self._kept.clear()
            self._ahead.clear()
            self._kept_bytes = self._ahead_bytes = 0
            self._scan = self._at
        if self._store is not None:
            self._store.clear()

    def close(self) -> None:
        """Stops the loader threads (held items stay; a later `get` starts them again)."""
        with self._cond:
            pool, self._pool = self._pool, None
            self._plan, self._at, self._scan = [], 0, 0
            self._demote_outside(set())
        if pool is not None and os.getpid() == self._pid:
            pool.shutdown(wait=True, cancel_futures=True)

    # -- forks ------------------------------------------------------------------------------

    def _pause(self) -> None:
        """Before a fork: no source call starts, and those running end (or time runs out)."""
        with self._cond:
            self._paused += 1
            self._cond.wait_for(
                lambda: not (self._active.keys() - _forking), timeout=_FORK_WAIT
            )  # fmt: skip

    def _resume(self) -> None:
        with self._cond:
            self._paused = max(0, self._paused - 1)
            self._cond.notify_all()

    # -- internals (the caller holds self._cond where noted) -----------------------------

    @property
    def _estimate(self) -> int:
        """What a load ahead sets aside: the largest of the recent items."""
        return max(self._sizes, default=0)

    def _call_load(self, key: Hashable) -> Any:
        me = threading.get_ident()
        with self._cond:
            self._counts["loads"] += 1
            # A thread that is itself forking never waits here (its own fork paused us).
            self._cond.wait_for(lambda: not self._paused or me in _forking)
            self._active[me] += 1
        try:
            item = self._load(key)
        except Exception as e:
            e.add_note(f"while loading item {key!r} for the preload cache")
            raise
        finally:
            with self._cond:
                self._active[me] -= 1
                if not self._active[me]:
                    del self._active[me]
                self._cond.notify_all()
        item = own(item)
        return item if self._pin is None else self._pin(item)

    def _wait(self, key: Hashable, future: Future[tuple[Any, bool]]) -> tuple[Any, bool]:
        item, kept = future.result()
        with self._cond:
            entry = self._items.get(key)
            if entry is not None:
                self._serve(key, entry)
                item, kept = entry.item, True
            self._pump()
        return item, kept

    def _load_now(self, key: Hashable, future: Future[tuple[Any, bool]]) -> tuple[Any, bool, bool]:
        """Loads `key` for the caller: (item, kept, found in the shared folder)."""
        try:
            found, item = self._store.read(key) if self._store is not None else (False, None)
            if not found:
                item = self._call_load(key)
        except BaseException as e:
            with self._cond:
                self._loading.pop(key, None)
                self._waiting.pop(key, None)
            future.set_exception(e)
            raise
        if found:
            kept = True
        elif self._store is not None:
            kept = self._store.write(key, item)
            if not kept:
                self._counts["not_kept"] += 1
        with self._cond:
            self._loading.pop(key, None)
            waiting = self._waiting.pop(key, 0)
            if self._store is None:
                kept = self._admit(key, item, ahead=False)
            self._pump()
        # The item comes back to this caller uncopied, who may change it as soon as `get`
        # returns: those waiting for it copy a copy made now.
        given = (
            fresh(item) if waiting and self.copy and (found or not kept or self._store) else item
        )
        future.set_result((given, kept))
        return item, kept, found

    def _serve(self, key: Hashable, entry: _Entry) -> None:
        """(lock held) The entry was served: it is kept now, the most recently used."""
        if entry.ahead:
            self._demote(key, entry)
        self._kept.move_to_end(key)

    def _demote(self, key: Hashable, entry: _Entry) -> None:
        """(lock held) An item loaded ahead becomes a kept one (evictable outside the window).

        Not yet served, it goes to the least-recently-used end, which is evicted last: it
        was loaded because it is wanted soon (a Tank's next batches), unlike one just served.
        `_serve` then moves it to the other end.
        """
        entry.ahead = False
        self._ahead.discard(key)
        self._ahead_bytes -= entry.size
        self._kept[key] = None
        self._kept.move_to_end(key, last=False)
        self._kept_bytes += entry.size

    def _demote_outside(self, window: set[Hashable]) -> None:
        """(lock held) Items loaded ahead that no plan wants now become evictable."""
        for key in [k for k in self._ahead if k not in window]:
            self._demote(key, self._items[key])

    def _key_at(self, position: int) -> Hashable:
        return self._plan[position % len(self._plan)]

    def _end(self) -> int:
        """(lock held) The plan position just past the window."""
        n = len(self._plan)
        if self._cyclic:
            return self._at + min(self.preloaded_data, n)
        return min(self._at + self.preloaded_data, n)

    def _advance(self, key: Hashable) -> None:
        """(lock held) Moves the plan past `key` when it is among the next keys planned.

        Items loaded ahead for the positions passed without being served become evictable.
        """
        if not self._plan:
            return
        n = len(self._plan)
        for offset in range(min(self.preloaded_data + 1, n)):
            position = self._at + offset
            if not self._cyclic and position >= n:
                return
            if self._key_at(position) == key:
                passed = [self._key_at(p) for p in range(self._at, position)]
                self._at = position + 1
                if passed:
                    window = set(self._window())
                    for k in passed:
                        entry = self._items.get(k)
                        if entry is not None and entry.ahead and k not in window:
                            self._demote(k, entry)
                return

    def _window(self) -> list[Hashable]:
        """(lock held) The next `preloaded_data` keys of the plan."""
        if not self._plan:
            return []
        return [self._key_at(p) for p in range(self._at, self._end())]

    def _admit(self, key: Hashable, item: Any, *, ahead: bool) -> bool:
        """(lock held) Holds `item` if it fits (making room when loaded ahead)."""
        if key in self._items:
            return False  # another load of the same key got there first
        size = nbytes(item, self._sizeof)
        self._sizes.append(size)
        if ahead:
            self._make_room(size)
        if not self._ledger.try_add(size):
            self._counts["dropped" if ahead else "not_kept"] += 1
            return False
        self._items[key] = _Entry(item, size, ahead)
        if ahead:
            self._ahead.add(key)
            self._ahead_bytes += size
        else:
            self._kept[key] = None
            self._kept_bytes += size
        self._peak = max(self._peak, self._ledger.used)
        return True

    def _make_room(self, size: int) -> None:
        """(lock held) Makes room for `size` bytes, or evicts nothing.

        Evicts kept items outside the window, the most recently used first, if that frees
        enough; otherwise nothing.
        """
        need = size - self._ledger.free()
        if need <= 0:
            return
        window = set(self._window())
        chosen, freed = [], 0
        for key in reversed(self._kept):
            if key in window:
                continue
            chosen.append(key)
            freed += self._items[key].size
            if freed >= need:
                break
        if freed < need:
            return
        for key in chosen:
            entry = self._items.pop(key)
            del self._kept[key]
            self._kept_bytes -= entry.size
            self._ledger.sub(entry.size)
            self._counts["evictions"] += 1

    def _room(self) -> int:
        """(lock held) Bytes loading ahead may still take.

        In memory: the free bytes, less what loads under way set aside; and kept items too
        (evictable unless in the window: counted all the same, the admission then decides
        exactly), but only while the items waiting to be served take at most half the
        budget, so the other half keeps what later epochs reuse. In a shared folder: its free
        bytes.
        """
        free = self._ledger.free() - self._reserved
        if self._store is not None:
            return free
        evicting = min(free + self._kept_bytes, self.max_memory_size // 2 - self._ahead_bytes)
        return max(free, evicting - self._reserved)

    def _pump(self) -> None:
        """(lock held) Starts loading the window's missing keys, within the budget.

        Walks the window from where the last walk stopped, so a `get` costs O(1) however
        large `preloaded_data` is.
        """
        if not self.threads or not self._plan or self._workers_use_the_folder():
            return
        end = self._end()
        position = max(self._scan, self._at)
        room: int | None = None
        while position < end:
            key = self._key_at(position)
            if key in self._items or key in self._loading or key in self._dropped:
                position += 1
                continue
            if self._store is not None and self._store.has(key):
                position += 1
                continue
            if len(self._loading) >= self.threads:
                break
            if room is None:
                room = self._room()
            if room < self._estimate:
                break  # back-pressure: the window fills the budget; wait for the consumer
            room -= self._estimate
            self._start(key, self._estimate)
            position += 1
        self._scan = position

    def _executor(self) -> ThreadPoolExecutor:
        """(lock held) The loader threads, started on first use."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="dualtrain-preload")
        return self._pool

    def _workers_use_the_folder(self) -> bool:
        """(lock held) Whether worker processes use the shared folder (checked every 0.1 s).

        They load ahead themselves then (a DataLoader's workers take the sampler's order
        through prefetch_factor), and this process loading too would load items twice.
        Shared only because of an unrelated fork, this process goes on loading ahead.
        """
        if self._store is None:
            return False
        now = time.monotonic()
        if now - self._workers_checked > 0.1:
            self._workers_checked, self._workers_seen = now, self._store.workers()
        return self._workers_seen

    def _start(self, key: Hashable, estimate: int) -> None:
        """(lock held) Loads `key` in a thread and admits it as an item ahead."""
        self._reserved += estimate
        future = self._executor().submit(self._load_ahead, key, estimate)
        self._loading[key] = future
        # A load `close` cancels before it runs never reaches `_load_ahead`: forget it here,
        # or a later `get` of its key would wait on a cancelled future.
        future.add_done_callback(lambda f: self._forget_cancelled(key, f, estimate))

    def _forget_cancelled(self, key: Hashable, future: Future[Any], estimate: int) -> None:
        if not future.cancelled():
            return
        with self._cond:
            if self._loading.get(key) is future:
                del self._loading[key]
                self._waiting.pop(key, None)
            self._reserved -= estimate
            self._scan = min(self._scan, self._at)

    def _load_ahead(self, key: Hashable, estimate: int) -> tuple[Any, bool]:
        try:
            item = self._call_load(key)
        except BaseException:
            with self._cond:
                self._loading.pop(key, None)
                self._waiting.pop(key, None)
                self._reserved -= estimate
                # Not loaded ahead again (it would fail on every step) until the consumer's
                # own `get` of it tries again and receives the error.
                self._dropped.add(key)
            raise
        stored = self._store.write(key, item) if self._store is not None else None
        with self._cond:
            self._loading.pop(key, None)
            self._waiting.pop(key, None)
            self._reserved -= estimate
            if stored is None:
                kept = self._admit(key, item, ahead=True)
            else:
                kept = stored
                self._sizes.append(nbytes(item, self._sizeof))
                if not kept:
                    self._counts["dropped"] += 1
            if not kept:
                self._dropped.add(key)
            self._pump()
        return item, kept

    # -- in a worker process ----------------------------------------------------------------

    def _get_shared(self, key: Hashable) -> Any:
        assert self._store is not None
        start = time.perf_counter()
        found, item = self._store.read(key)
        if found:
            self._counts["hits"] += 1
        else:
            item = self._call_load(key)
            if not self._store.write(key, item):
                self._counts["not_kept"] += 1
            self._counts["misses"] += 1
            self._counts["data_wait_ns"] += int((time.perf_counter() - start) * 1e9)
        self._store.record(self._counts)
        return item
