"""The start rung checked against eager in a daemon thread, beside the job, and stopped at exit.

Under JAX the start is ``jax.jit`` and the reference op-by-op JAX, which can take longer
than a short job: `Verification` runs it beside the job (`dispatch.Decider` reads the
verdict at a later call). At interpreter exit a thread still inside the framework is
stopped at a Python check point first: torn down by finalization inside native code, it
aborts the process. A forked child marks the start unverified (the thread is not there).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import site
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from dualtrain.accelerate.compare import compare
from dualtrain.accelerate.ladder import Trial, describe_error
from dualtrain.accelerate.options import LadderOptions

__all__ = ["Verification"]


class _Abandoned(BaseException):
    """Raised inside a verification thread still running when the interpreter exits.

    It is made (``__init__`` runs) in the thread it lands in, where it is first handled
    (a ``finally``, a ``with``'s exit, an ``except``: often a library's). Once the thread
    has swallowed stops for `PARK_AFTER_S`, it also sets a trace function in that thread
    (`_park_where_parkable`) that parks the thread at its next call into the user's own
    code: blocked on a lock that is never released, at a Python line with the
    interpreter's lock free, it neither runs on nor comes back from native code while the
    interpreter finalizes.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        ident = threading.get_ident()
        if ident in _parking:
            # No stop is sent from here on (`abandon`): one landing between the tracer's
            # note that it parks and its wait would unset it with the thread still running.
            _tracing.add(ident)
            sys.settrace(_park_where_parkable)  # this thread's only


_verifying: set[Verification] = set()
_parking: set[int] = set()  # threads whose next stop sets the parking tracer
_tracing: set[int] = set()  # threads whose parking tracer is set: no more stops
_parked: set[int] = set()  # threads parked for good
_NEVER = threading.Lock()
_NEVER.acquire()
PARK_AFTER_S = 1.0  # seconds of swallowed stops before a thread is parked instead
# Code that holds a lock while it calls other code (a logging handler's, the import lock,
# a Condition's): a thread parked below one of theirs would keep it, and the exit's later
# steps (logging.shutdown, JAX's clean-up) would wait for it for ever.
# (functools: Python 3.11's cached_property holds one lock while a getter runs.)
_LOCKING = frozenset(
    {"logging", "threading", "importlib", "_frozen_importlib", "_frozen_importlib_external",
     "queue", "concurrent", "multiprocessing", "functools", "sched"}
)  # fmt: skip
_LIBRARIES = tuple(
    {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    | set(site.getsitepackages())
    | {site.getusersitepackages()}
)
_INSTALLED = ("/site-packages/", "/dist-packages/")  # any environment's installed packages
_OURS = frozenset({"dualtrain", "dualtrain_torch", "dualtrain_jax"})


def _park_where_parkable(frame: FrameType, event: str, arg: object) -> None:
    # A trace function that never raises (one that raises is unset): it blocks, for good,
    # at the first call into code where parking holds no lock (`_parkable`).
    if event == "call" and _parkable(frame):
        _parked.add(threading.get_ident())
        _NEVER.acquire()


def _parkable(frame: FrameType | None) -> bool:
    """Whether a thread may park as `frame` starts.

    In the user's own code (not a library's, whose locks are held across such a point:
    JAX's backend lock, a cache's), and below no code that holds a lock while it calls
    out (`_LOCKING`).
    """
    if frame is None:
        return False
    name, path = str(frame.f_globals.get("__name__", "")), frame.f_code.co_filename
    if (
        path.startswith(("<frozen", *_LIBRARIES)) or any(part in path for part in _INSTALLED)
        or name.partition(".")[0] in _OURS
    ):  # fmt: skip
        return False
    while frame is not None and frame.f_code is not _RUN_CODE:  # up to the thread's work
        if str(frame.f_globals.get("__name__", "")).partition(".")[0] in _LOCKING:
            return False
        frame = frame.f_back
    return True


class Verification:
    """The start rung's results checked against eager's, in a daemon thread.

    Under JAX the start is ``jax.jit`` and the reference op-by-op JAX, which can take
    longer than a short job (seconds for a CNN's training step, one small XLA program per
    operation): it runs beside the job instead of before it. The job is served by the
    start meanwhile, exactly what ``jax.jit`` by hand would serve; the verdict is read at
    a later call, and a start that differs is replaced by eager then, said on stderr and
    in ``explain()``. Until the verdict, no candidate is tried and nothing is cached.

    Args:
        reference: the eager trial, built, on the batch the start ran.
        names, got: the start's results on that batch (host copies).
        options: the tolerances.
        on_ok: called in the thread with the verdict when the start agrees (the decision
            cache keeps it then, even when the job ends before it reads the verdict).
    """

    def __init__(
        self,
        reference: Trial,
        names: list[str],
        got: list[Any],
        options: LadderOptions,
        on_ok: Callable[[Verification], None] | None = None,
    ) -> None:
        self.reference, self.names, self.got, self.options = reference, names, got, options
        self.on_ok = on_ok
        self.done = False
        self.ok = True
        self.verified = False  # False with ok: eager could not run the batch (unverified)
        self.reason = ""
        self.max_error: float | None = None
        self.seconds = 0.0
        self._left = False  # the thread has left `_verify`: no stop is sent from then on
        self._thread = threading.Thread(target=self._run, name="dualtrain-verify", daemon=True)

    def start(self) -> None:
        """Starts the thread (once the decision it may keep is registered)."""
        _watch_exit()
        _verifying.add(self)
        self._thread.start()

    def _run(self) -> None:
        # An exit stops the thread with _Abandoned, sent (and re-sent) until `_left` reads
        # True (`abandon`). It lands only at the interpreter's check points (calls, backward
        # jumps), so the store of `_left` below, the finally's first instruction, has none
        # before it: a stop sent before it is pending at most (one slot a thread), and
        # `_checkpoint` makes it land inside this try, where it is caught.
        try:
            try:
                self._verify()
            finally:
                self._left = True
                _verifying.discard(self)
                _checkpoint()
        except _Abandoned:
            pass

    def _verify(self) -> None:
        clock = self.options.clock
        start = clock()
        try:
            want_names, want = self.reference.check()
            verdict = compare(want_names, want, self.got, self.options)
            self.ok, self.reason, self.max_error = verdict.ok, verdict.reason, verdict.max_error
            if want_names != self.names:
                self.ok, self.reason = False, "results named differently"
            self.verified = True
        except Exception as error:  # eager cannot run the batch: the start stays unverified
            self.ok, self.reason = True, "unverified: eager raised " + describe_error(error)
        finally:
            self.seconds = clock() - start
            self.got = []  # the host copies are not needed past the verdict
        if self.ok and self.verified and self.on_ok is not None:
            with contextlib.suppress(Exception):  # keeping it is a saving, never a failure
                self.on_ok(self)
        self.done = True

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the verdict (at most `timeout` seconds); whether it came."""
        self._thread.join(timeout)
        return self.done

    def abandon(self, timeout_s: float = 10.0) -> None:
        """Stops the thread at its next check point (at interpreter exit), within `timeout_s`.

        The stop is sent again every 20 ms until the thread has left its work: one that
        lands where it is swallowed (a ``__del__``, a weakref callback, a library's broad
        ``except``) would otherwise leave the thread running into the interpreter's
        finalization, which ends a thread inside native code with an abort. Code that
        swallows every stop (a retry loop around the user's function) is parked after
        `PARK_AFTER_S` instead: at its next call into the user's own code the thread
        blocks there, for good. One that never calls it is left after `timeout_s`.
        """
        ident = self._thread.ident
        if ident is None:
            return
        send = ctypes.pythonapi.PyThreadState_SetAsyncExc
        tid, stop = ctypes.c_ulong(ident), ctypes.py_object(_Abandoned)
        start = time.monotonic()
        while self._thread.is_alive() and ident not in _parked:
            waited = time.monotonic() - start
            if waited >= timeout_s:
                break
            if waited >= PARK_AFTER_S:
                _parking.add(ident)
            if not self._left and ident not in _tracing:  # read and sent with no check
                send(tid, stop)  # point between: no thread switch
            self._thread.join(0.02)

    def forked(self) -> None:
        """Marks the check unverified in a forked child, where its thread does not exist."""
        self.ok, self.verified, self.reason = True, False, "unverified: the process forked"
        self._left = self.done = True


_RUN_CODE = Verification._run.__code__  # the thread's own frames start below it


def _checkpoint() -> None:
    """Does nothing: calling a Python function is a check point for a pending stop."""


def _abandon_verifications() -> None:
    # A daemon thread still inside JAX when the interpreter finalizes is torn down mid-call
    # (the class of abort a gloo thread caused at exit): stop each at a Python instruction.
    for verification in list(_verifying):
        verification.abandon()


def _after_fork_in_child() -> None:
    for verification in list(_verifying):
        verification.forked()
    _verifying.clear()


_exit_watched = [False]


def _watch_exit() -> None:
    # Registered at the first verification, not at import: atexit runs handlers last in,
    # first out, so this runs before the framework's own (JAX's clear_backends), imported
    # by then, while the framework still stands.
    if not _exit_watched[0]:
        _exit_watched[0] = True
        atexit.register(_abandon_verifications)


os.register_at_fork(after_in_child=_after_fork_in_child)
