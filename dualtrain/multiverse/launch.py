"""Spawning a run's workers and watching them: the first failure stops them all.

A framework with an agent of its own (torch's elastic agent; `DistributedTraits.agent`)
launches the workers itself; what is shared with it here is the workers' reporting
(`report_failure` and `report_result` into a pipe or a `FileReport` in the run's folder,
`failure_error`) and the stopping of what a worker started (`own_group`, `stop_groups`).
The spawner below is for a framework without one (JAX: ``jax.distributed`` has none).

Workers are started with the ``spawn`` method (never ``fork``: a forked copy of a process
that has torch's or JAX's threads running can deadlock), each with torchrun's variables in its
environment. The parent waits on every worker's pipe and process sentinel at once. A worker
that raises sends its rank, step and traceback before it exits; one that dies (SIGKILL, a
crash) is noticed by its sentinel. Either way the parent terminates the others (SIGTERM, then
SIGKILL after a grace period), reaps every process and raises `WorkerError` naming the rank
and the step. Ctrl-C in the parent stops every worker the same way. Each worker watches its
parent and exits when the parent is gone, so no worker outlives a killed parent.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from dualtrain.errors import ArgumentError, WorkerError

__all__ = [
    "GRACE",
    "ExitWatch",
    "FileReport",
    "check_class",
    "check_picklable",
    "end_group",
    "environment",
    "exit_soon",
    "failure_error",
    "own_group",
    "read_report",
    "report_failure",
    "report_result",
    "run_workers",
    "stop_groups",
    "watch_parent",
]

GRACE = 5.0  # seconds a terminated worker gets before SIGKILL
_COLLECT = 1.0  # seconds to gather other reports after the first failure: find the first cause
_ENV_LOCK = threading.Lock()


def check_picklable(universe: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Refuses a universe or arguments the spawned workers cannot receive (before any start)."""
    try:
        pickle.dumps(universe)
    except Exception as err:
        raise ArgumentError(
            f"universe must be a function defined at the top level of an importable module "
            f"(spawned workers import it by name); got universe={universe!r} ({err})"
        ) from None
    for i, arg in enumerate(args):
        try:
            pickle.dumps(arg)
        except Exception as err:
            raise ArgumentError(
                f"the arguments of mv(...) reach the workers by pickle: argument {i} must be "
                f"picklable; got {arg!r} ({err})"
            ) from None


def check_class(cls: type) -> None:
    """Refuses a Multiverse subclass that spawned workers cannot import by name."""
    try:
        pickle.dumps(cls)
    except Exception as err:
        raise ArgumentError(
            f"a Multiverse subclass runs in every spawned worker, which imports it by name: "
            f"define {cls.__qualname__} at the top level of an importable module, taking "
            f"(universe, nworld, **options) as Multiverse does ({err})"
        ) from None


def run_workers(
    target: Callable[..., Any],
    payloads: Sequence[tuple[Any, ...]],
    environments: Sequence[Mapping[str, str]],
    steps: Any,
) -> Any:
    """Runs ``target(conn, rank, *payloads[rank])`` in one spawned process per rank.

    `environments[rank]` is set in the worker's environment before it starts (so it is there
    before the worker imports anything); `steps` is a shared array of each rank's step.

    Returns:
        What rank 0 sent back as its result.

    Raises:
        WorkerError: a worker raised or died (the earliest, when several did).
        KeyboardInterrupt: Ctrl-C; every worker is stopped first.
    """
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    conns: dict[Connection, int] = {}
    try:
        for rank, (payload, env) in enumerate(zip(payloads, environments, strict=True)):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=target, args=(writer, rank, os.getpid(), *payload),
                name=f"dualtrain-multiverse-{rank}", daemon=False,
            )  # fmt: skip
            procs.append(proc)  # before it starts: a Ctrl-C now still stops it
            conns[reader] = rank
            # The variables must be in the worker's environment before its first import (a
            # script importing JAX at its top reads XLA_FLAGS then), so they are set here,
            # under a lock, and restored at once.
            with _ENV_LOCK, _Environment(env):
                proc.start()
            writer.close()  # the worker holds the only write end: EOF when it is gone
        return _supervise(procs, conns, steps)
    finally:
        _stop(procs)
        for conn in conns:
            conn.close()


def _supervise(procs: list[Any], conns: dict[Connection, int], steps: Any) -> Any:
    results: dict[int, Any] = {}
    # (kind, time, rank, step, what): kind 0 a death (no report), 1 a reported error. A
    # death leaves no message and makes its peers' collectives fail after it, so a death
    # in the collection window is the cause and is named first.
    failures: list[tuple[int, float, int, int, str]] = []
    alive = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    deadline: float | None = None
    reported: dict[int, float] = {}  # rank -> when its result came: it has only to exit
    while alive or conns:
        ends = [t + GRACE * (2 if t + GRACE < time.monotonic() else 1)
                for r, t in reported.items() if procs[r].is_alive()]  # fmt: skip
        if deadline is not None:
            ends.append(deadline)
        timeout = max(0.0, min(ends) - time.monotonic()) if ends else None
        waited = time.time()  # a death noticed now happened after this
        ready = wait([*conns, *alive], timeout)
        for item in ready:
            if item in conns:
                _receive(item, conns, results, failures)
        for rank in results.keys() - reported.keys():
            reported[rank] = time.monotonic()
        for item in ready:
            if item in alive:
                rank = alive.pop(item)
                procs[rank].join()
                _drain(rank, conns, results, failures)
                code = procs[rank].exitcode
                if rank in results or any(f[2] == rank for f in failures):
                    continue  # its exit (or a hang ended by a signal) tells nothing more
                what = _death(code) if code != 0 else "exited without a result"
                failures.append((0, waited, rank, int(steps[rank]), what))
        # A worker that reported and hangs on its way out (a framework's teardown can
        # deadlock) has done its work: it is stopped, not waited for; killed if it must be.
        now = time.monotonic()
        for rank, when in reported.items():
            if procs[rank].is_alive() and now > when + GRACE:
                _signal_group(procs[rank], signal.SIGKILL if now > when + 2 * GRACE
                              else signal.SIGTERM)  # fmt: skip
        if failures and deadline is None:
            deadline = now + _COLLECT
        if deadline is not None and now >= deadline:
            break
    if failures:
        _, _, rank, step, what = min(failures)
        others = sorted({f[2] for f in failures} - {rank})
        also = f" (then rank(s) {others} failed too)" if others else ""
        raise WorkerError(f"Multiverse worker rank {rank} failed at step {step}: {what}{also}",
                          rank, step)  # fmt: skip
    return results.get(0)


def _receive(
    conn: Connection, conns: dict[Connection, int], results: dict[int, Any],
    failures: list[tuple[int, float, int, int, str]],
) -> None:  # fmt: skip
    rank = conns[conn]
    try:
        kind, step, body, when = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        conns.pop(conn)
        conn.close()
        return
    except Exception as err:  # a result that does not unpickle here
        kind, step, body, when = "error", 0, f"its result could not be received: {err!r}", 0.0
        when = time.time()
    if kind == "result":
        results[rank] = body
    else:
        failures.append((1, when, rank, step, body))


def _drain(
    rank: int, conns: dict[Connection, int], results: dict[int, Any],
    failures: list[tuple[int, float, int, int, str]],
) -> None:  # fmt: skip
    """Reads what a finished worker left in its pipe (its report may arrive after its exit)."""
    for conn in [c for c, r in conns.items() if r == rank]:
        while conn in conns and conn.poll():
            _receive(conn, conns, results, failures)
        if conn in conns:
            conns.pop(conn)
            conn.close()


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} without reporting an error"


def _stop(procs: list[Any]) -> None:
    """Stops every worker and whatever it started (each leads its own process group).

    SIGTERM to each group, then SIGKILL to what is left after the grace period.
    """
    started = [p for p in procs if p.pid is not None]
    for proc in started:
        _signal_group(proc, signal.SIGTERM)
    end = time.monotonic() + GRACE
    for proc in started:
        proc.join(max(0.0, end - time.monotonic()))
    for proc in started:
        _signal_group(proc, signal.SIGKILL)
        proc.join()


def _signal_group(proc: Any, sig: int) -> None:
    """Sends `sig` to the worker's process group (its children too), else to the worker."""
    try:
        os.killpg(proc.pid, sig)  # the worker made its group, id = its pid (`own_group`)
    except (ProcessLookupError, PermissionError):
        if proc.is_alive():  # it died before making its group, or has not made it yet
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)


class _Environment:
    """Sets variables in ``os.environ`` for the duration of a ``with`` block."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self.values.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def report_failure(conn: Connection | FileReport, step: int, err: BaseException) -> None:
    """Sends a worker's error to the parent: its type, message and traceback."""
    text = "".join(traceback.format_exception(err)).rstrip()
    summary = f"{type(err).__name__}: {err}"
    with contextlib.suppress(OSError, ValueError):  # the parent is gone: nothing to tell
        _send(conn, ("error", step, f"{summary}\n{text}", time.time()))


def report_result(conn: Connection | FileReport, step: int, result: Any) -> None:
    """Sends rank 0's result (anything picklable) to the parent."""
    try:
        _send(conn, ("result", step, result, time.time()))
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        _send(conn, ("error", step, f"its result could not be sent: {err!r}", time.time()))


def _send(conn: Connection | FileReport, message: tuple[Any, ...]) -> None:
    # Plain pickle, by value: Connection.send pickles with multiprocessing's reducers, which
    # send a torch tensor as a handle to this process's shared memory, gone once it exits.
    conn.send_bytes(pickle.dumps(message))


def own_group() -> None:
    """Makes this worker the leader of a process group, so stopping it stops its children."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def end_group(sig: int = signal.SIGKILL) -> None:
    """Stops this worker's group, itself and every process it started (Tank workers, pools)."""
    with contextlib.suppress(OSError):
        if os.getpgid(0) == os.getpid():
            os.killpg(0, sig)


def watch_parent(parent: int) -> None:
    """Ends this worker and its children as soon as its parent (pid `parent`) is gone."""

    def loop() -> None:
        while True:
            if os.getppid() != parent:
                end_group()
                os._exit(70)
            time.sleep(0.2)

    threading.Thread(target=loop, name="dualtrain-parent-watch", daemon=True).start()


# ---- a run launched by a framework's agent: reports through the run's folder ------------


class FileReport:
    """A worker's report channel in the run's folder: ``report.<attempt>.<rank>``.

    Stands in for the pipe of a spawned worker (`report_failure`, `report_result` take
    either): the message is written to a temporary name and renamed, so the launching
    process reads a whole report or none.
    """

    def __init__(self, folder: Path, attempt: int, rank: int) -> None:
        self.path = folder / f"report.{attempt}.{rank}"

    def send_bytes(self, data: bytes) -> None:
        """Writes the report (atomically)."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)

    def close(self) -> None:
        """Nothing to close (the pipe's counterpart)."""


def read_report(folder: Path, attempt: int, rank: int) -> tuple[str, int, Any, float] | None:
    """What rank `rank` reported in `attempt`: (kind, step, body, time), or None."""
    path = folder / f"report.{attempt}.{rank}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        kind, step, body, when = pickle.loads(data)
    except Exception as err:  # a result that does not unpickle here
        return "error", 0, f"its result could not be received: {err!r}", time.time()
    return kind, int(step), body, float(when)


def failure_error(
    folder: Path, attempt: int, processes: int, failed: Mapping[int, int],
    steps: Callable[[int], int], first: tuple[int, int, str] | None = None,
    ended: Mapping[int, tuple[int, int | None]] | None = None,
) -> WorkerError:  # fmt: skip
    """The WorkerError of a failed attempt, naming the first cause's rank and step.

    Args:
        folder: the run's folder (the workers' reports).
        attempt: the attempt that failed.
        processes: the run's processes.
        failed: the ranks the launcher saw fail, with their exit codes.
        steps: a rank's steps (for one that died without a report).
        first: (rank, step, what) known to come first (a stalled worker, named by its rank).
        ended: the ranks seen ending, in order, with their exit codes (`ExitWatch`): one
            that ended without a report no later than the first that reported an error
            died first (its peers' collectives failed because of it); one that ended after
            was stopped by the launcher.
    """
    # (kind, time, rank, step, what): kind -1 a known first cause, 0 a death without a
    # report (it makes its peers' collectives fail after it), 1 a reported error.
    failures: list[tuple[int, float, int, int, str]] = []
    if first is not None:
        failures.append((-1, 0.0, *first))
    named = {f[2] for f in failures}
    for rank in range(processes):
        report = read_report(folder, attempt, rank) if rank not in named else None
        if report is not None and report[0] == "error":
            failures.append((1, report[3], rank, report[1], str(report[2])))
    named = {f[2] for f in failures}
    ended = ended or {}
    cause_by = min((ended[r][0] for r in named if r in ended), default=None)
    for rank, (order, code) in sorted(ended.items()):
        if rank in named or read_report(folder, attempt, rank) is not None:
            continue  # it reported: an error, or its result (then `failed` tells)
        if cause_by is None or order <= cause_by:
            code = code if code is not None else failed.get(rank)
            what = (
                "died without reporting an error" if code is None
                else _death(code) if code < 0
                else f"exited with code {code} without reporting an error"
            )  # fmt: skip
            failures.append((0, float(order), rank, steps(rank), what))
    named = {f[2] for f in failures}
    for rank, code in sorted(failed.items()):
        result = read_report(folder, attempt, rank) is not None
        if rank not in named and (rank not in ended or result):
            what = (
                _death(code) if code < 0 else f"exited with code {code} without reporting an error"
            )
            if result:
                what = f"{what} (after reporting its result)"
            failures.append((0, 0.0, rank, steps(rank), what))
    if not failures:  # the launcher failed with no rank named
        failures.append((0, 0.0, 0, steps(0), "the launcher failed without naming a rank"))
    _, _, rank, step, what = min(failures)
    others = sorted({f[2] for f in failures} - {rank})
    also = f" (then rank(s) {others} failed too)" if others else ""
    return WorkerError(
        f"Multiverse worker rank {rank} failed at step {step}: {what}{also}", rank, step
    )


def stop_groups(pids: Sequence[int]) -> None:
    """Stops what is left of each worker's process group (its children): SIGTERM, then SIGKILL.

    Each worker leads its own group (`own_group`), which outlives it while a child of it
    lives; the launcher has already stopped the workers themselves.
    """
    alive = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
            alive.append(pid)
    end = time.monotonic() + GRACE
    while alive and time.monotonic() < end:
        alive = [pid for pid in alive if _group_alive(pid)]
        time.sleep(0.05)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in ``os.environ`` while the block runs (a launcher's workers inherit them)."""
    with _ENV_LOCK, _Environment(values):
        yield


def exit_soon(after: float) -> None:
    """Ends this process with status 0: `after` seconds from now, or once it exits, if sooner.

    For a worker that has reported its result: a teardown that hangs or fails (a
    framework's, an ``atexit`` handler, multiprocessing's own finalizers, which turn an
    error into status 1) must not make its launcher wait, nor count as a failure. At exit
    the other ``atexit`` handlers still run, in their order, then the process ends with
    status 0 without the interpreter's finalization.
    """

    def last() -> None:  # registered last, so it runs first
        atexit.unregister(last)
        try:
            atexit._run_exitfuncs()  # the others, in their order; their errors are printed
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(0)

    atexit.register(last)

    def end() -> None:
        time.sleep(after)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)

    threading.Thread(target=end, name="dualtrain-exit-soon", daemon=True).start()


class ExitWatch:
    """Sees each worker of a launched run end, in order, and how, without reaping it.

    For workers that a framework's agent started in this process: the agent reaps them and
    tells of the first failure it noticed only. A thread peeks at every started worker's
    pid (its row in `beats`) every 10 ms with ``waitid(WNOWAIT)``, which reads a child's exit
    status and leaves it to be reaped, and records the order in which they ended: a worker
    that died before any peer reported an error is the run's first cause.

    Attributes:
        ended: (attempt, rank) -> (the poll that saw it end, its exit code: negative for a
            signal; None when it was reaped before it was seen).
    """

    PERIOD = 0.01

    def __init__(self, beats: Any) -> None:
        self.beats = beats
        self.ended: dict[tuple[int, int], tuple[int, int | None]] = {}
        self._count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dualtrain-exits", daemon=True)

    def __enter__(self) -> ExitWatch:
        if hasattr(os, "waitid"):  # not on macOS: there the agent's failures alone tell
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
            self.poll()  # what ended since the last poll, last in order

    def _loop(self) -> None:
        while not self._stop.wait(self.PERIOD):
            self.poll()

    def poll(self) -> None:
        """Records the workers that have ended since the last poll, as this poll's."""
        self._count += 1
        count = self._count
        for beat in self.beats.read():
            key = (beat.attempt, beat.rank)
            if not beat.pid or key in self.ended:
                continue
            try:
                seen = os.waitid(os.P_PID, beat.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # reaped already (or not this process's child)
                self.ended[key] = (count, None)
                continue
            if seen is not None:
                killed = seen.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
                self.ended[key] = (count, -seen.si_status if killed else seen.si_status)

    def of(self, attempt: int) -> dict[int, tuple[int, int | None]]:
        """The ranks of `attempt` seen ending: rank -> (order, exit code or None)."""
        return {rank: end for (a, rank), end in self.ended.items() if a == attempt}
