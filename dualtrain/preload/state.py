"""The state one `PreloadCache` holds, and the one way its source is called.

`CacheState` declares what the parts of the cache share (`dualtrain.preload.plan` walks the
plan and loads ahead, `dualtrain.preload.sharing` serves through the shared folder,
`dualtrain.preload.cache` is the consumer's side); `PreloadCache._start_runtime` sets it.
Every call of the source goes through `_call_load`, which a fork pauses
(`dualtrain.preload.forks`).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.preload import forks, shared
from dualtrain.preload.sizes import own

__all__ = ["CacheState", "Entry", "Loader", "check_count"]

Loader = Callable[[Any], Any]


@dataclasses.dataclass
class Entry:
    """A held item, its size in bytes, and whether it was loaded ahead and not served yet."""

    item: Any
    size: int
    ahead: bool  # loaded for the plan and not served yet


def check_count(name: str, value: object, low: int) -> int:
    """`value` as an int >= `low` (NumPy ints taken, bools refused), else ArgumentError."""
    if isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise bad_argument(name, value, f"an int >= {low}")
    return value


class CacheState:
    """What a cache holds and knows (set by `PreloadCache`), and its source calls."""

    # -- the settings ----------------------------------------------------------------------
    max_memory_size: int
    preloaded_data: int
    threads: int
    copy: bool
    _load: Loader
    _sizeof: Callable[[Any], int | None] | None
    _pin: Callable[[Any], Any] | None
    _shareable: bool
    _store: shared.SharedStore | None
    _finalizer: weakref.finalize[Any, Any] | None
    # -- the runtime (one per process) -----------------------------------------------------
    _pid: int
    _owner: bool
    _cond: threading.Condition
    _items: dict[Hashable, Entry]
    _kept: collections.OrderedDict[Hashable, None]
    _ahead: set[Hashable]
    _dropped: set[Hashable]  # loaded ahead without room: not again till served
    _kept_bytes: int
    _loading: dict[Hashable, Future[tuple[Any, bool]]]
    _waiting: collections.Counter[Hashable]  # callers waiting on a key's load
    _plan: list[Hashable]
    _at: int
    _cyclic: bool
    _pool: ThreadPoolExecutor | None
    _reserved: int  # bytes set aside for items being loaded ahead
    _sizes: collections.deque[int]  # recent items
    _ahead_bytes: int
    _scan: int  # plan position before which every key was seen to by `_pump`
    _paused: int  # forks under way: no source call starts while one is
    _workers_checked: float
    _workers_seen: bool
    _active: collections.Counter[int]  # threads in `load`
    _counts: collections.Counter[str]
    _peak: int
    _ledger: Any

    # -- forks ------------------------------------------------------------------------------

    def _pause(self) -> None:
        """Before a fork: no source call starts, and those running end (or time runs out)."""
        with self._cond:
            self._paused += 1
            self._cond.wait_for(
                lambda: not (self._active.keys() - forks.forking), timeout=forks.FORK_WAIT
            )  # fmt: skip

    def _resume(self) -> None:
        with self._cond:
            self._paused = max(0, self._paused - 1)
            self._cond.notify_all()

    # -- the source ------------------------------------------------------------------------

    @property
    def _estimate(self) -> int:
        """What a load ahead sets aside: the largest of the recent items."""
        return max(self._sizes, default=0)

    def _call_load(self, key: Hashable) -> Any:
        me = threading.get_ident()
        with self._cond:
            self._counts["loads"] += 1
            # A thread that is itself forking never waits here (its own fork paused us).
            self._cond.wait_for(lambda: not self._paused or me in forks.forking)
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
