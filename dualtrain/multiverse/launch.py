"""A launched run's neutral half: its workers' reports, their ends, the stopping of what stays.

The adapter's agent (`DistributedTraits.agent`: torch's elastic agent, JAX's spawner) starts
and restarts the workers and tells which failed, by exit code; everything else about the run
is here, the same for both. A worker reports through the run's folder (`FileReport`: rank 0's
result, or an error with its step and traceback) and leads a process group of its own
(`own_group`) so that stopping it stops its children (`stop_groups`); it watches its parent
and exits when the parent is gone (`watch_parent`), and once reported it ends with status 0
whatever its teardown does (`exit_soon`). The launching process sees each worker end, in
order (`ExitWatch`), stops a worker that reported its result but hangs on its way out
(`ReportWatch`: its ``exit_soon`` cannot run while a teardown holds the GIL), and names the
first cause's rank and step (`failure_error`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dualtrain.errors import ArgumentError, WorkerError

__all__ = [
    "GRACE",
    "ExitWatch",
    "FileReport",
    "ReportWatch",
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
    "stop_groups",
    "watch_parent",
]

GRACE = 5.0  # seconds a terminated worker gets before SIGKILL
# Held only while workers start (`environment`): two launches in one process do not mix.
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


def report_failure(report: FileReport, step: int, err: BaseException) -> None:
    """Tells the launching process a worker's error: its type, message and traceback."""
    text = "".join(traceback.format_exception(err)).rstrip()
    summary = f"{type(err).__name__}: {err}"
    with contextlib.suppress(OSError):  # the run's folder is gone: nobody to tell
        report.write(("error", step, f"{summary}\n{text}", time.time()))


def report_result(report: FileReport, step: int, result: Any) -> None:
    """Tells the launching process rank 0's result (anything picklable)."""
    try:
        report.write(("result", step, result, time.time()))
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        report.write(("error", step, f"its result could not be sent: {err!r}", time.time()))


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


class FileReport:
    """A worker's report in the run's folder: ``report.<attempt>.<rank>`` (`read_report`).

    The message is written to a temporary name and renamed, so the launching process reads a
    whole report or none.
    """

    def __init__(self, folder: Path, attempt: int, rank: int) -> None:
        self.path = folder / f"report.{attempt}.{rank}"

    def write(self, message: tuple[Any, ...]) -> None:
        """Writes (kind, step, body, time), pickled by value, atomically."""
        data = pickle.dumps(message)  # first: a body that does not pickle leaves no file
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)


def read_report(folder: Path, attempt: int, rank: int) -> tuple[str, int, Any, float] | None:
    """What rank `rank` reported in `attempt`: (kind, step, body, time), or None."""
    try:
        data = FileReport(folder, attempt, rank).path.read_bytes()
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
            what = "died without reporting an error" if code is None else _death(code)
            failures.append((0, float(order), rank, steps(rank), what))
    named = {f[2] for f in failures}
    for rank, code in sorted(failed.items()):
        result = read_report(folder, attempt, rank) is not None
        if rank not in named and (rank not in ended or result):
            what = _death(code) + (" (after reporting its result)" if result else "")
            failures.append((0, 0.0, rank, steps(rank), what))
    if not failures:  # the launcher failed with no rank named
        failures.append((0, 0.0, 0, steps(0), "the launcher failed without naming a rank"))
    _, _, rank, step, what = min(failures)
    others = sorted({f[2] for f in failures} - {rank})
    also = f" (then rank(s) {others} failed too)" if others else ""
    return WorkerError(
        f"Multiverse worker rank {rank} failed at step {step}: {what}{also}", rank, step
    )


def _death(code: int) -> str:
    if code == 0:
        return "exited without a result"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} without reporting an error"


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
    """`values` in ``os.environ`` while the block runs (the workers started in it inherit them).

    Under a lock, so that two launches in one process do not mix their variables.
    """
    with _ENV_LOCK:
        saved = {key: os.environ.get(key) for key in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def exit_soon(after: float) -> None:
    """Ends this process with status 0 once it exits, its teardown given `after` seconds.

    For a worker that has reported its result: a teardown that hangs or fails (a
    framework's, an ``atexit`` handler, multiprocessing's own finalizers, which turn an
    error into status 1) must not make its launcher wait, nor count as a failure. At exit
    the other ``atexit`` handlers still run, in their order, then the process ends with
    status 0 without the interpreter's finalization; if they take longer than `after`
    seconds, it ends then.

    The clock starts at exit, not at the report: until its function has returned, a worker
    may wait on its agent (torch's hands each return value over and waits until every rank
    has returned), and ending it there would leave the agent waiting for it.
    """

    def end() -> None:
        time.sleep(after)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)

    def last() -> None:  # registered last, so it runs first
        atexit.unregister(last)
        threading.Thread(target=end, name="dualtrain-exit-soon", daemon=True).start()
        try:
            atexit._run_exitfuncs()  # the others, in their order; their errors are printed
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(0)

    atexit.register(last)


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


class ReportWatch:
    """Watches the run's reports while the agent runs: ends what an agent would wait on.

    A worker that has reported its result has done its work, and its own `exit_soon` ends
    it GRACE after it starts to exit; but a teardown that holds the GIL (an ``atexit``
    handler in a C loop) keeps that thread from running, and an agent would wait for it
    forever. Once every worker of its attempt has reported or ended (before that, a reported
    worker may rightly wait on its agent for the slowest), one still alive GRACE (and a
    second, for its own exit to come first) later gets SIGTERM to its group, another GRACE
    later SIGKILL. Its end is no failure, whatever its exit code (`finished`): both agents,
    and Multiverse, ask.

    A worker that ended without any report and not by a code an agent counts (status 0, or
    reaped before it was seen) failed: every other worker of its attempt is stopped
    (SIGTERM to its group), so that an agent that waits for every worker's return value
    (torch's) sees a failure and returns.
    """

    PERIOD = 0.1
    LATE = 1.0  # seconds past GRACE: the worker's own exit (status 0) comes first if it can

    def __init__(self, folder: Path, beats: Any) -> None:
        self.folder, self.beats = folder, beats
        self._seen: dict[tuple[int, int], float] = {}  # (attempt, rank) -> result seen at
        self._done: set[tuple[int, int]] = set()  # nothing more to do for these
        self._ended: set[tuple[int, int]] = set()  # ended, reported or not
        self._settled: dict[int, float] = {}  # attempt -> when all its workers were done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dualtrain-reports", daemon=True)

    def __enter__(self) -> ReportWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def finished(self, attempt: int, rank: int) -> bool:
        """Whether rank `rank` reported its result in `attempt` (its end is then no failure)."""
        report = read_report(self.folder, attempt, rank)
        return report is not None and report[0] == "result"

    def _loop(self) -> None:
        while not self._stop.wait(self.PERIOD):
            try:
                self.poll()
            except Exception as err:  # a watch that fails must say so, and go on
                warnings.warn(f"Multiverse's report watch: {err!r}", RuntimeWarning, stacklevel=1)

    def poll(self) -> None:
        """Signals the reported workers that outstayed their grace, and the peers of a mute end."""
        now = time.monotonic()
        rows = self.beats.read()  # one a rank; pid 0 until its worker starts
        beats = [b for b in rows if b.pid]
        for beat in beats:
            key = (beat.attempt, beat.rank)
            if key in self._done:
                continue
            if key not in self._seen:
                if FileReport(self.folder, *key).path.exists():
                    if self.finished(*key):
                        self._seen[key] = now
                    else:
                        self._done.add(key)  # an error: its agent sees it fail
                        self._ended.add(key)
                    continue
                code = _ended(beat.pid)
                if code is False:
                    continue
                self._done.add(key)
                self._ended.add(key)
                if code in (0, None) and not FileReport(self.folder, *key).path.exists():
                    for peer in beats:
                        mate = peer.attempt == beat.attempt and peer.rank != beat.rank
                        if mate and _ended(peer.pid) is False:  # a child of ours, running
                            with contextlib.suppress(ProcessLookupError, PermissionError):
                                os.killpg(peer.pid, signal.SIGTERM)
                continue
            settled = self._settled_at(beat.attempt, rows, now)
            if settled is None:
                continue
            late = now - settled - self.LATE
            if late < GRACE:
                continue
            if _ended(beat.pid) is not False:
                self._done.add(key)
                continue
            kill = late >= 2 * GRACE
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(beat.pid, signal.SIGKILL if kill else signal.SIGTERM)
            if kill:
                self._done.add(key)

    def _settled_at(self, attempt: int, beats: list[Any], now: float) -> float | None:
        """When every worker of `attempt` had reported its result or ended; None: not yet.

        `beats` holds every rank's row, started or not: a worker that has not started yet
        (pid 0, or an earlier attempt's row) keeps the attempt unsettled.
        """
        if attempt not in self._settled:
            keys = [(b.attempt, b.rank) for b in beats]
            if any(not b.pid or b.attempt != attempt for b in beats):
                return None  # a worker of this attempt has not started yet
            if not all(k in self._seen or k in self._ended for k in keys):
                return None
            self._settled[attempt] = now
        return self._settled[attempt]


def _ended(pid: int) -> int | bool | None:
    """False while this process's child `pid` runs, then its exit code, or None if reaped.

    A negative code: killed by that signal; None: reaped before this asked.
    """
    if not hasattr(os, "waitid"):  # macOS: its group still alive
        return False if _group_alive(pid) else None
    try:
        seen = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return None
    if seen is None:
        return False
    killed = seen.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
    return -seen.si_status if killed else seen.si_status
