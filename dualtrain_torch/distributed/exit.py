"""Leaving a process group so that the process can end: collectives' tensors released first.

A gloo worker thread drops a finished collective's tensors after the caller's ``wait()``
has returned, and dropping a tensor Python made takes the GIL. Were the interpreter
already finalizing by then (the script returned right after its last collective), Python
ends that thread from inside a C++ destructor and the whole process aborts ("terminate
called without an active exception", SIGABRT: seen one run in ten under torchrun). Joining
the threads first does not help: a group's destructor runs with the GIL held, and joins a
thread that waits for the GIL.

So every tensor this adapter hands to a collective is registered here (`handed`), and
`release` waits, with the GIL free, until the worker threads have dropped them all.
Collectives a script issues itself are not registered: `release` also leaves the threads a
short GIL-free window for those.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable

import torch

__all__ = ["handed", "in_flight", "release"]

_refs: dict[int, weakref.ref[torch.Tensor]] = {}
_lock = threading.Lock()
WINDOW_S = 0.01  # the GIL-free window left for collectives this adapter did not issue


def handed(*tensors: torch.Tensor) -> None:
    """Registers tensors given to a collective (until a worker thread drops the last one)."""
    for tensor in tensors:
        key = id(tensor)

        def gone(_: object, key: int = key) -> None:
            with _lock:
                _refs.pop(key, None)

        with _lock:
            _refs[key] = weakref.ref(tensor, gone)


def in_flight() -> int:
    """How many registered tensors are still alive (held by a caller or a worker thread)."""
    with _lock:
        refs = list(_refs.values())
    return sum(1 for ref in refs if ref() is not None)


def release(
    limit_s: float = 10.0,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Waits with the GIL free until no registered tensor is left; True if none is.

    `limit_s` bounds the wait (seconds): a tensor the caller still holds is never released
    here, and a process should end all the same.
    """
    deadline = clock() + limit_s
    while in_flight() and clock() < deadline:
        sleep(0.001)  # time.sleep drops the GIL: a waiting worker thread takes it
    sleep(WINDOW_S)
    return in_flight() == 0
