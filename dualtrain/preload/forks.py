"""Forks and the preload caches: shared before a fork, their source calls paused across it.

A fork copies only the forking thread: a source's lock held by a loader thread at that
moment would stay held in the child for good. So before a fork every live cache of this
process that owns its items is paused (no source call starts; those running end, or
`FORK_WAIT` runs out) and shared (the child finds the items in the shared folder); after
it the parent's caches resume. A forked child's caches start afresh (`PreloadCache` sees
the new pid).
"""

from __future__ import annotations

# Before this module's hook is registered: Python runs fork hooks newest first, and these
# two take a lock in theirs (logging's module lock, the thread pools' shutdown lock). Were
# they registered after this one, a thread forking would take that lock and then wait here
# for a loader thread whose own fork waits for that lock: a deadlock (seen when `import
# dualtrain` stopped loading every part up front, so these came later).
import concurrent.futures.thread  # noqa: F401
import logging  # noqa: F401
import os
import threading
import weakref
from typing import Protocol

__all__ = ["FORK_WAIT", "LIVE", "Forked", "forking"]


class Forked(Protocol):
    """A live cache (`PreloadCache`), paused and shared before a fork, resumed after it."""

    def before_fork(self) -> None: ...
    def after_fork(self) -> None: ...


# Every live cache, so a fork shares them first (the child then finds their folder).
LIVE: weakref.WeakSet[Forked] = weakref.WeakSet()
# How long a fork waits for loads in flight (a source's lock held at the fork would stay
# held in the child for good): seconds.
FORK_WAIT = 10.0


# Threads forking now: a fork does not wait for another thread's load that is itself a fork
# (a source that forks, in two loader threads at once, would make each wait for the other).
forking: set[int] = set()


def _before_fork() -> None:
    forking.add(threading.get_ident())
    for cache in list(LIVE):
        cache.before_fork()


def _after_fork_in_parent() -> None:
    forking.discard(threading.get_ident())
    for cache in list(LIVE):
        cache.after_fork()


def _after_fork_in_child() -> None:
    forking.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
