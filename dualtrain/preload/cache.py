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
import dataclasses
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

from dualtrain.errors import bad_argument
from dualtrain.preload import shared
from dualtrain.preload.budget import LocalLedger, check_budget
from dualtrain.preload.sizes import fresh, nbytes, own

__all__ = ["PreloadCache"]

Loader = Callable[[Any], Any]


@dataclasses.dataclass
class _Entry:
    item: Any
    size: int
    ahead: bool  # loaded for the plan and not served yet


def _check_count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise bad_argument(name, value, f"an int >= {low}")
    return value


# Every live cache, so a fork shares them first (the child then finds their folder).
_LIVE: weakref.WeakSet[PreloadCache] = weakref.WeakSet()


def _share_before_fork() -> None:
    for cache in list(_LIVE):
        if cache._owner and cache._shareable:
            cache.share()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_share_before_fork)


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
        self._largest = 0  # the largest item seen: what a load ahead sets aside
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

        The bytes this process holds move into the shared ledger, so the budget covers every
        process. None where the cache is not shareable.
        """
        if not self._shareable:
            return None
        if self._store is None:
            with self._cond:
                if self._store is None:
                    store = shared.SharedStore.create(self.max_memory_size, self._ledger.used)
                    self._store, self._ledger = store, store
                    self._finalizer = weakref.finalize(self, store.remove)
        return self._store.path

    def __getstate__(self) -> dict[str, Any]:
        path = self.share() if self._owner else self._store.path if self._store else None
        return {
            "load": self._load, "max_memory_size": self.max_memory_size,
            "preloaded_data": self.preloaded_data, "threads": self.threads,
            "copy": self.copy, "sizeof": self._sizeof, "shareable": self._shareable,
            "pin": self._pin, "shared_path": path,
        }  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

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
            item, kept = self._load_now(key, mine)
        else:
            try:
                item, kept = self._wait(key, future)
            except CancelledError:  # `close` cancelled that load ahead before it ran
                return self.get(key)
        with self._cond:
            self._counts["misses" if mine is not None else "prefetch_waits"] += 1
            self._counts["data_wait_ns"] += int((time.perf_counter() - start) * 1e9)
        # An item another caller also received, or one the cache holds, is copied.
        shared_item = kept or mine is None
        return fresh(item) if self.copy and shared_item else item

    def get_many(self, keys: Iterable[Hashable]) -> list[Any]:
        """The items of `keys`, in order; the missing ones loaded in parallel by the threads."""
        keys = list(keys)
        self._check_process()
        if self._owner and self.threads:
            with self._cond:
                for key in keys:
                    if key not in self._items and key not in self._loading:
                        self._start(key, self._largest)
        return [self.get(key) for key in keys]

    def expect(self, keys: Iterable[Hashable], *, cyclic: bool = False) -> None:
        """Says the next keys asked for are `keys`, in this order (replacing earlier plans).

        The threads load the first `preloaded_data` of them ahead and move along the plan as
        its keys are asked for. `cyclic`: the plan repeats (an order every epoch follows).
        """
        self._check_process()
        plan = list(keys)
        if not self._owner or self._store is not None:
            # Shared with worker processes, it is theirs to load (DataLoader workers take a
            # sampler's order ahead through prefetch_factor); what this process loaded ahead
            # would sit in its memory, where no worker reads it.
            return
        with self._cond:
            # Keys dropped for want of room stay skipped until served (a Tank re-plans every
            # batch: clearing them here would load them again at every batch).
            self._plan, self._at, self._cyclic = plan, 0, bool(cyclic) and bool(plan)
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
        """Drops every held item (the shared folder's items stay until its owner goes)."""
        self._check_process()
        with self._cond:
            for entry in self._items.values():
                self._ledger.sub(entry.size)
            self._items.clear()
            self._kept.clear()
            self._ahead.clear()
            self._kept_bytes = 0

    def close(self) -> None:
        """Stops the loader threads (held items stay; a later `get` starts them again)."""
        with self._cond:
            pool, self._pool = self._pool, None
            self._plan, self._at = [], 0
        if pool is not None and os.getpid() == self._pid:
            pool.shutdown(wait=True, cancel_futures=True)

    # -- internals (the caller holds self._cond where noted) -----------------------------

    def _call_load(self, key: Hashable) -> Any:
        with self._cond:
            self._counts["loads"] += 1
        try:
            item = self._load(key)
        except Exception as e:
            e.add_note(f"while loading item {key!r} for the preload cache")
            raise
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

    def _load_now(self, key: Hashable, future: Future[tuple[Any, bool]]) -> tuple[Any, bool]:
        try:
            item = self._call_load(key)
        except BaseException as e:
            with self._cond:
                self._loading.pop(key, None)
                self._waiting.pop(key, None)
            future.set_exception(e)
            raise
        with self._cond:
            self._loading.pop(key, None)
            waiting = self._waiting.pop(key, 0)
            kept = self._admit(key, item, ahead=False)
            self._pump()
        # An item not kept comes back to this caller uncopied, who may change it as soon as
        # `get` returns: those waiting for it copy a copy made now.
        given = fresh(item) if waiting and not kept and self.copy else item
        future.set_result((given, kept))
        return item, kept

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
        self._kept[key] = None
        self._kept.move_to_end(key, last=False)
        self._kept_bytes += entry.size

    def _advance(self, key: Hashable) -> None:
        """(lock held) Moves the plan past `key` when it is among the next keys planned."""
        if not self._plan:
            return
        n = len(self._plan)
        for offset in range(min(self.preloaded_data + 1, n)):
            position = self._at + offset
            if not self._cyclic and position >= n:
                return
            if self._plan[position % n] == key:
                self._at = position + 1
                if self._cyclic:
                    self._at %= n
                return

    def _window(self) -> list[Hashable]:
        """(lock held) The next `preloaded_data` keys of the plan."""
        n = len(self._plan)
        if not n:
            return []
        if self._cyclic:
            count = min(self.preloaded_data, n)
            return [self._plan[(self._at + i) % n] for i in range(count)]
        return self._plan[self._at : self._at + self.preloaded_data]

    def _admit(self, key: Hashable, item: Any, *, ahead: bool) -> bool:
        """(lock held) Holds `item` if it fits (making room when loaded ahead)."""
        if key in self._items:
            return False  # another load of the same key got there first
        size = nbytes(item, self._sizeof)
        self._largest = max(self._largest, size)
        if ahead:
            self._make_room(size)
        if not self._ledger.try_add(size):
            self._counts["dropped" if ahead else "not_kept"] += 1
            return False
        self._items[key] = _Entry(item, size, ahead)
        if ahead:
            self._ahead.add(key)
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

    def _pump(self) -> None:
        """(lock held) Starts loading the window's missing keys, within the budget."""
        if not self.threads:
            return
        window = self._window()  # empty without a plan: every item ahead is evictable then
        in_window = set(window)
        for key in [k for k in self._ahead if k not in in_window]:  # the plan moved on
            self._demote(key, self._items[key])
        # Bytes that loading ahead may take: free, and kept items outside the window.
        held_in_window = sum(self._items[k].size for k in in_window if k in self._kept)
        room = self._ledger.free() - self._reserved + self._kept_bytes - held_in_window
        for key in window:
            if len(self._loading) >= self.threads:
                return
            if key in self._items or key in self._loading or key in self._dropped:
                continue
            if room < self._largest:
                return  # back-pressure: the window fills the budget; wait for the consumer
            room -= self._largest
            self._start(key, self._largest)

    def _start(self, key: Hashable, estimate: int) -> None:
        """(lock held) Loads `key` in a thread and admits it as an item ahead."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="dualtrain-preload")
        self._reserved += estimate
        future = self._pool.submit(self._load_ahead, key, estimate)
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
        with self._cond:
            self._loading.pop(key, None)
            self._waiting.pop(key, None)
            self._reserved -= estimate
            kept = self._admit(key, item, ahead=True)
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
