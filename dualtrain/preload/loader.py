"""A cache's source and its loader threads: the one call site of ``load``, and loading ahead.

Every call of the source goes through `Loader.call`, which a fork pauses
(`dualtrain.preload.forks`). The threads load the window's missing keys (`Loader.pump`)
within the budget, from where the last walk stopped; the loads under way are in
`Loader.loading`, where a consumer asking for one of their keys waits on it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from dualtrain.preload import forks
from dualtrain.preload.shared import SharedStore
from dualtrain.preload.sizes import nbytes, own
from dualtrain.preload.window import Window

__all__ = ["Loader"]


class Loader:
    """The source's calls, the loads under way and the threads that load ahead.

    The caller holds the cache's lock `cond` where a method says "(lock held)".

    Args:
        load: ``load(key) -> item``.
        threads: loader threads (0: nothing is loaded ahead).
        sizeof: ``sizeof(obj) -> int | None`` for the byte count (`nbytes`).
        pin: ``pin(item) -> item`` applied before an item is held.
        cond: the cache's lock, which its consumer's side holds too.
        window: the window the threads load ahead for, and admit into.
        store: the shared folder (None: not shared yet); `share` sets it.
    """

    def __init__(
        self,
        load: Callable[[Any], Any],
        *,
        threads: int,
        sizeof: Callable[[Any], int | None] | None,
        pin: Callable[[Any], Any] | None,
        cond: threading.Condition,
        window: Window,
        store: SharedStore | None,
    ) -> None:
        self.load, self.threads, self.sizeof, self.pin = load, threads, sizeof, pin
        self.cond, self.window, self.store = cond, window, store
        self._pool: ThreadPoolExecutor | None = None
        self.loading: dict[Hashable, Future[tuple[Any, bool]]] = {}
        self.waiting: collections.Counter[Hashable] = collections.Counter()  # on a key's load
        self.reserved = 0  # bytes set aside for items being loaded ahead
        self._dropped: set[Hashable] = set()  # loaded ahead without room: not again till asked
        self._scan = 0  # plan position before which every key was seen to by `pump`
        self._paused = 0  # forks under way: no source call starts while one is
        self._active: collections.Counter[int] = collections.Counter()  # threads in `load`
        self._workers_checked, self._workers_seen = 0.0, False
        self.counts: collections.Counter[str] = collections.Counter()  # loads, dropped

    # -- forks ------------------------------------------------------------------------------

    def pause(self) -> None:
        """Before a fork: no source call starts, and those running end (or time runs out)."""
        with self.cond:
            self._paused += 1
            self.cond.wait_for(
                lambda: not (self._active.keys() - forks.forking), timeout=forks.FORK_WAIT
            )  # fmt: skip

    def resume(self) -> None:
        with self.cond:
            self._paused = max(0, self._paused - 1)
            self.cond.notify_all()

    # -- the source ------------------------------------------------------------------------

    def call(self, key: Hashable) -> Any:
        """``load(key)``, owned (`own`) and pinned; its error notes the key."""
        me = threading.get_ident()
        with self.cond:
            self.counts["loads"] += 1
            # A thread that is itself forking never waits here (its own fork paused us).
            self.cond.wait_for(lambda: not self._paused or me in forks.forking)
            self._active[me] += 1
        try:
            item = self.load(key)
        except Exception as e:
            e.add_note(f"while loading item {key!r} for the preload cache")
            raise
        finally:
            with self.cond:
                self._active[me] -= 1
                if not self._active[me]:
                    del self._active[me]
                self.cond.notify_all()
        item = own(item)
        return item if self.pin is None else self.pin(item)

    def sized(self, key: Hashable) -> tuple[Any, int]:
        """`call`, and the item's bytes (a bad sizeof fails the load, as an error)."""
        item = self.call(key)
        return item, nbytes(item, self.sizeof)

    # -- the loads under way ---------------------------------------------------------------

    def join(self, key: Hashable) -> tuple[Future[tuple[Any, bool]], bool]:
        """(lock held) The load of `key` under way, waited for; else a new one (True) to make.

        The caller that makes a load sets its result; others asking meanwhile wait for it.
        """
        future = self.loading.get(key)
        if future is not None:
            self.waiting[key] += 1
            return future, False
        future = self.loading[key] = Future()
        return future, True

    def finish(self, key: Hashable) -> int:
        """(lock held) The load of `key` is over; returns how many callers waited for it."""
        self.loading.pop(key, None)
        return self.waiting.pop(key, 0)

    def forget(self, key: Hashable, future: Future[Any]) -> None:
        """(lock held) A load that never ran: its waiters load the key themselves."""
        if self.loading.get(key) is future:
            del self.loading[key]
            self.waiting.pop(key, None)

    def asked(self, key: Hashable) -> None:
        """(lock held) The consumer asked for `key`: loaded ahead again if it was dropped."""
        self._dropped.discard(key)

    def rewind(self) -> None:
        """(lock held) The next `pump` walks the window from its start."""
        self._scan = min(self._scan, self.window.at)

    def share(self, store: SharedStore) -> None:
        """(lock held) Loads ahead into the shared folder `store` from now."""
        self.store = store
        self.rewind()

    # -- loading ahead ---------------------------------------------------------------------

    def executor(self) -> ThreadPoolExecutor:
        """(lock held) The loader threads, started on first use."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="dualtrain-preload")
        return self._pool

    def stop(self) -> ThreadPoolExecutor | None:
        """(lock held) The loader threads, to shut down; a later load starts new ones."""
        pool, self._pool = self._pool, None
        return pool

    def pump(self) -> None:
        """(lock held) Starts loading the window's missing keys, within the budget.

        Walks the window from where the last walk stopped, so a `get` costs O(1) however
        large `preloaded_data` is.
        """
        window = self.window
        if not self.threads or not window.plan or self._workers_use_the_folder():
            return
        end = window.end()
        position = max(self._scan, window.at)
        room: int | None = None
        while position < end:
            key = window.key_at(position)
            if key in window.items or key in self.loading or key in self._dropped:
                position += 1
                continue
            if self.store is not None and self.store.has(key):
                position += 1
                continue
            if len(self.loading) >= self.threads:
                break
            if room is None:
                room = window.room(self.reserved)
            if room < window.estimate:
                break  # back-pressure: the window fills the budget; wait for the consumer
            room -= window.estimate
            self._start(key, window.estimate)
            position += 1
        self._scan = position

    def _workers_use_the_folder(self) -> bool:
        """(lock held) Whether worker processes use the shared folder (checked every 0.1 s).

        They load ahead themselves then (a DataLoader's workers take the sampler's order
        through prefetch_factor), and this process loading too would load items twice.
        Shared only because of an unrelated fork, this process goes on loading ahead.
        """
        if self.store is None:
            return False
        now = time.monotonic()
        if now - self._workers_checked > 0.1:
            self._workers_checked, self._workers_seen = now, self.store.workers()
        return self._workers_seen

    def _start(self, key: Hashable, estimate: int) -> None:
        """(lock held) Loads `key` in a thread and admits it as an item ahead."""
        self.reserved += estimate
        future = self.executor().submit(self._load_ahead, key, estimate)
        self.loading[key] = future
        # A load `close` cancels before it runs never reaches `_load_ahead`: forget it here,
        # or a later `get` of its key would wait on a cancelled future.
        future.add_done_callback(lambda f: self._forget_cancelled(key, f, estimate))

    def _forget_cancelled(self, key: Hashable, future: Future[Any], estimate: int) -> None:
        if not future.cancelled():
            return
        with self.cond:
            self.forget(key, future)
            self.reserved -= estimate
            self.rewind()

    def _load_ahead(self, key: Hashable, estimate: int) -> tuple[Any, bool]:
        try:
            item, size = self.sized(key)
        except BaseException:
            with self.cond:
                self.finish(key)
                self.reserved -= estimate
                # Not loaded ahead again (it would fail on every step) until the consumer's
                # own `get` of it tries again and receives the error.
                self._dropped.add(key)
            raise
        stored = self.store.write(key, item) if self.store is not None else None
        with self.cond:
            self.finish(key)
            self.reserved -= estimate
            if stored is None:
                kept = self.window.admit(key, item, size, ahead=True)
            else:
                kept = stored
                self.window.note(size)
                if not kept:
                    self.counts["dropped"] += 1
            if not kept:
                self._dropped.add(key)
            self.pump()
        return item, kept
