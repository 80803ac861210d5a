"""The plan and loading ahead along it: a cache's window, admission, eviction and threads.

`PlanWalk` keeps the plan (`PreloadCache.expect`) and the position of the next key asked
for; the window is the next `preloaded_data` keys from there. Items loaded ahead for the
window are never evicted while in it; an item loaded ahead that does not fit evicts kept
items outside it, the most recently used first. `_pump` starts the loader threads on the
window's missing keys, within the budget, from where its last walk stopped.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from dualtrain.preload.sizes import nbytes
from dualtrain.preload.state import CacheState, Entry

__all__ = ["PlanWalk"]


class PlanWalk(CacheState):
    """The plan's window, admission within the budget, and the loader threads.

    The caller holds ``self._cond`` where a method says "(lock held)".
    """

    def _serve(self, key: Hashable, entry: Entry) -> None:
        """(lock held) The entry was served: it is kept now, the most recently used."""
        if entry.ahead:
            self._demote(key, entry)
        self._kept.move_to_end(key)

    def _demote(self, key: Hashable, entry: Entry) -> None:
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

    def _admit(self, key: Hashable, item: Any, size: int, *, ahead: bool) -> bool:
        """(lock held) Holds `item` of `size` bytes if it fits (making room when ahead).

        `size` is counted by the loading thread before the lock, with the load: a user's
        ``sizeof`` that fails or answers badly fails that load, never the bookkeeping.
        """
        if key in self._items:
            return False  # another load of the same key got there first
        self._sizes.append(size)
        if ahead:
            self._make_room(size)
        if not self._ledger.try_add(size):
            self._counts["dropped" if ahead else "not_kept"] += 1
            return False
        self._items[key] = Entry(item, size, ahead)
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
            size = nbytes(item, self._sizeof)  # a bad sizeof fails the load, as an error
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
                kept = self._admit(key, item, size, ahead=True)
            else:
                kept = stored
                self._sizes.append(size)
                if not kept:
                    self._counts["dropped"] += 1
            if not kept:
                self._dropped.add(key)
            self._pump()
        return item, kept
