"""Sharing a cache's items with worker processes through its shared folder.

The owner's `share` makes the folder (`dualtrain.preload.shared`) once and moves its held
items into it; a worker's copy (forked, or unpickled from a shared cache) serves every
`get` through the folder, against the same budget, and loads nothing ahead: the
DataLoader's or Tank's workers are the parallelism there.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Hashable
from typing import Any

from dualtrain.preload import shared
from dualtrain.preload.state import CacheState

__all__ = ["SharedFolder"]


class SharedFolder(CacheState):
    """The owner's `share`, and a worker process's `get` through the shared folder."""

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
