"""A cache's plan and its window, and the items it holds within the budget.

`Window` keeps the plan (`PreloadCache.expect`) and the position of the next key asked
for; the window is the next `preloaded_data` keys from there. Items loaded ahead for the
window are never evicted while in it; an item loaded ahead that does not fit evicts kept
items outside it, the most recently used first. Every admission goes through the ledger
(`dualtrain.preload.budget`, or the shared folder's once the cache is shared).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Hashable
from typing import Any

from dualtrain.preload.budget import LocalLedger
from dualtrain.preload.shared import SharedStore

__all__ = ["Entry", "Window"]


@dataclasses.dataclass
class Entry:
    """A held item, its size in bytes, and whether it was loaded ahead and not served yet."""

    item: Any
    size: int
    ahead: bool  # loaded for the plan and not served yet


class Window:
    """The plan's window, the held items in their eviction order, and admission.

    Each method is called with the cache's lock held (its loader threads share it).

    Args:
        preloaded_data: the window: how many upcoming keys of the plan are loaded ahead.
        ledger: the bytes held against the budget.
    """

    def __init__(self, preloaded_data: int, ledger: LocalLedger | SharedStore) -> None:
        self.preloaded_data, self.ledger = preloaded_data, ledger
        self.shared = isinstance(ledger, SharedStore)  # items are held in the shared folder
        self.plan: list[Hashable] = []
        self.at = 0  # the plan position of the next key asked for
        self._cyclic = False
        self.items: dict[Hashable, Entry] = {}
        self._kept: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self._ahead: set[Hashable] = set()
        self._kept_bytes = self._ahead_bytes = 0
        self._sizes: collections.deque[int] = collections.deque(maxlen=16)  # recent items
        self.peak = 0
        self.counts: collections.Counter[str] = collections.Counter()  # refused and evicted

    def expect(self, plan: list[Hashable], cyclic: bool) -> None:
        """A new plan, from its start; items loaded ahead that it does not want become evictable."""
        self.plan, self.at = plan, 0
        self._cyclic = bool(cyclic) and bool(plan)
        self._demote_outside(set(self.keys()))

    def serve(self, key: Hashable, entry: Entry) -> None:
        """The entry was served: it is kept now, the most recently used."""
        if entry.ahead:
            self._demote(key, entry)
        self._kept.move_to_end(key)

    def _demote(self, key: Hashable, entry: Entry) -> None:
        """An item loaded ahead becomes a kept one (evictable outside the window).

        Not yet served, it goes to the least-recently-used end, which is evicted last: it
        was loaded because it is wanted soon (a Tank's next batches), unlike one just served.
        `serve` then moves it to the other end.
        """
        entry.ahead = False
        self._ahead.discard(key)
        self._ahead_bytes -= entry.size
        self._kept[key] = None
        self._kept.move_to_end(key, last=False)
        self._kept_bytes += entry.size

    def _demote_outside(self, window: set[Hashable]) -> None:
        """Items loaded ahead that no plan wants now become evictable."""
        for key in [k for k in self._ahead if k not in window]:
            self._demote(key, self.items[key])

    def key_at(self, position: int) -> Hashable:
        return self.plan[position % len(self.plan)]

    def end(self) -> int:
        """The plan position just past the window."""
        n = len(self.plan)
        if self._cyclic:
            return self.at + min(self.preloaded_data, n)
        return min(self.at + self.preloaded_data, n)

    def advance(self, key: Hashable) -> None:
        """Moves the plan past `key` when it is among the next keys planned.

        Items loaded ahead for the positions passed without being served become evictable.
        """
        if not self.plan:
            return
        n = len(self.plan)
        for offset in range(min(self.preloaded_data + 1, n)):
            position = self.at + offset
            if not self._cyclic and position >= n:
                return
            if self.key_at(position) == key:
                passed = [self.key_at(p) for p in range(self.at, position)]
                self.at = position + 1
                if passed:
                    window = set(self.keys())
                    for k in passed:
                        entry = self.items.get(k)
                        if entry is not None and entry.ahead and k not in window:
                            self._demote(k, entry)
                return

    def keys(self) -> list[Hashable]:
        """The next `preloaded_data` keys of the plan."""
        if not self._cyclic:  # a slice: a Tank hands a plan of this window at every step
            return self.plan[self.at : self.end()]
        return [self.key_at(p) for p in range(self.at, self.end())]

    @property
    def estimate(self) -> int:
        """What a load ahead sets aside: the largest of the recent items."""
        return max(self._sizes, default=0)

    def note(self, size: int) -> None:
        """An item of `size` bytes was loaded ahead into the shared folder (for `estimate`)."""
        self._sizes.append(size)

    def admit(self, key: Hashable, item: Any, size: int, *, ahead: bool) -> bool:
        """Holds `item` of `size` bytes if it fits (making room when ahead).

        `size` is counted by the loading thread before the lock, with the load: a user's
        ``sizeof`` that fails or answers badly fails that load, never the bookkeeping.
        """
        if key in self.items:
            return False  # another load of the same key got there first
        self._sizes.append(size)
        if ahead:
            self._make_room(size)
        if not self.ledger.try_add(size):
            self.counts["dropped" if ahead else "not_kept"] += 1
            return False
        self.items[key] = Entry(item, size, ahead)
        if ahead:
            self._ahead.add(key)
            self._ahead_bytes += size
        else:
            self._kept[key] = None
            self._kept_bytes += size
        self.peak = max(self.peak, self.ledger.used)
        return True

    def _make_room(self, size: int) -> None:
        """Makes room for `size` bytes, or evicts nothing.

        Evicts kept items outside the window, the most recently used first, if that frees
        enough; otherwise nothing.
        """
        need = size - self.ledger.free()
        if need <= 0:
            return
        window = set(self.keys())
        chosen, freed = [], 0
        for key in reversed(self._kept):
            if key in window:
                continue
            chosen.append(key)
            freed += self.items[key].size
            if freed >= need:
                break
        if freed < need:
            return
        for key in chosen:
            entry = self.items.pop(key)
            del self._kept[key]
            self._kept_bytes -= entry.size
            self.ledger.sub(entry.size)
            self.counts["evictions"] += 1

    def room(self, reserved: int) -> int:
        """Bytes loading ahead may still take, `reserved` being set aside for loads under way.

        In memory: the free bytes, less `reserved`; and kept items too (evictable unless in
        the window: counted all the same, the admission then decides exactly), but only
        while the items waiting to be served take at most half the budget, so the other half
        keeps what later epochs reuse. In a shared folder: its free bytes.
        """
        free = self.ledger.free() - reserved
        if self.shared:
            return free
        evicting = min(free + self._kept_bytes, self.ledger.limit // 2 - self._ahead_bytes)
        return max(free, evicting - reserved)

    def clear(self) -> None:
        """Drops every held item, giving its bytes back to the ledger."""
        for entry in self.items.values():
            self.ledger.sub(entry.size)
        self._empty()

    def share(self, store: SharedStore) -> None:
        """Moves the held items into the shared folder `store` and admits against it from now.

        What does not fit there is dropped.
        """
        for key, entry in self.items.items():
            store.write(key, entry.item)
        self._empty()
        self.ledger, self.shared = store, True

    def _empty(self) -> None:
        self.items.clear()
        self._kept.clear()
        self._ahead.clear()
        self._kept_bytes = self._ahead_bytes = 0
