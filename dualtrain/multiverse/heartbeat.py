"""Each worker's progress in a shared file: its pid, its steps and when it last took one.

A run that Multiverse launches keeps a folder (``DUALTRAIN_MULTIVERSE_RUN`` in the workers'
environment) with one file, ``beats``, of one row a rank: ``(pid, steps, last step's time,
state, attempt, steps begun)``, memory-mapped, so a worker's step costs a few stores to memory
and no system call. The launching process reads the rows: to name the step of a worker that
died without a word, and to name a worker that has stopped making progress.

The rule (`stalled`): a running worker whose steps have not advanced for `heartbeat` seconds
is stalled; of several, the one behind is named (fewest steps begun, then the oldest last
step). A worker blocked in a collective of its next step has begun that step (a synced
model's forward and a JAX learner's dispatch count a step as it starts; a torch learner's
step, counted at its end, says when it begins: ``on_begin``), so the worker named is the one
that stopped, not the peer whose collective would time out later. A worker is watched from
its first step on: its start (imports, joining the run, which `timeout` bounds, a first
compilation) is not.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["RUN", "Beat", "Beats", "Watchdog", "check_heartbeat", "kill_group", "stalled"]

RUN = "DUALTRAIN_MULTIVERSE_RUN"  # the run's folder, in a launched worker's environment
_FIELDS = 6  # pid, steps, time, state, attempt, steps begun
STARTING, RUNNING, DONE = 0, 1, 2


@dataclass(frozen=True)
class Beat:
    """One rank's row: its pid (0: not started), steps, last step's time, state, attempt.

    `begun`: the steps it had begun, where steps are counted at their end (0: not told).
    """

    rank: int
    pid: int
    steps: int
    time: float
    state: int
    attempt: int
    begun: int = 0

    @property
    def reached(self) -> int:
        """The steps it has begun: a step counted at its end is reached as it begins."""
        return max(self.steps, self.begun)


def check_heartbeat(heartbeat: Any) -> float | None:
    """`heartbeat` checked: None (no watch) or a positive, finite number of seconds."""
    if heartbeat is None:
        return None
    if (
        isinstance(heartbeat, bool)
        or not isinstance(heartbeat, (int, float))
        or not math.isfinite(heartbeat)
        or heartbeat <= 0
    ):
        raise bad_argument("heartbeat", heartbeat, "None or a positive number of seconds")
    return float(heartbeat)


def stalled(beats: list[Beat], now: float, heartbeat: float) -> Beat | None:
    """The worker to name as stalled at time `now`, or None.

    Only the rows of the latest attempt count, and of them only running ones (a worker that
    finished, or has not taken its first step, is not stalled). Stalled: no step for more than
    `heartbeat` seconds. Of several stalled, the one behind: fewest steps begun, then
    fewest taken, then the oldest last step.
    """
    latest = max((b.attempt for b in beats if b.pid), default=None)
    late = [
        b
        for b in beats
        if b.pid and b.attempt == latest and b.state == RUNNING and now - b.time > heartbeat
    ]
    return min(late, key=lambda b: (b.reached, b.steps, b.time, b.rank)) if late else None


class Beats:
    """The ``beats`` file of a run folder: one row a rank (see the module's docstring).

    Made by the launching process for `processes` ranks (`create`); a worker opens it
    (`open`) and writes its own row only.
    """

    def __init__(self, path: Path, processes: int) -> None:
        self.path = path
        self._rows = np.memmap(path, dtype=np.float64, mode="r+", shape=(processes, _FIELDS))

    @classmethod
    def create(cls, folder: Path, processes: int) -> Beats:
        """A zeroed file for `processes` ranks in `folder`."""
        path = folder / "beats"
        path.write_bytes(bytes(8 * _FIELDS * processes))
        return cls(path, processes)

    @classmethod
    def open(cls, folder: Path) -> Beats:
        """The file of the run in `folder` (a worker's view)."""
        path = folder / "beats"
        processes = path.stat().st_size // (8 * _FIELDS)
        return cls(path, processes)

    def start(self, rank: int, attempt: int) -> None:
        """Rank `rank` starts (its attempt, pid and start time; no step yet)."""
        row = self._rows[rank]
        row[:] = (0, 0, time.time(), STARTING, attempt, 0)
        row[0] = os.getpid()

    def step(self, rank: int, steps: int) -> None:
        """Rank `rank` has taken `steps` steps, now."""
        row = self._rows[rank]
        row[2] = time.time()
        row[1] = steps
        row[3] = RUNNING

    def begin(self, rank: int, begun: int) -> None:
        """Rank `rank` begins its step `begun` (a step counted at its end)."""
        self._rows[rank, 5] = begun

    def done(self, rank: int) -> None:
        """Rank `rank` has finished its work (reported): no longer watched."""
        self._rows[rank, 3] = DONE

    def read(self) -> list[Beat]:
        """Every rank's row, now."""
        rows = np.array(self._rows)
        return [
            Beat(rank, int(r[0]), int(r[1]), float(r[2]), int(r[3]), int(r[4]), int(r[5]))
            for rank, r in enumerate(rows)
        ]

    def __getitem__(self, rank: int) -> int:
        """Rank `rank`'s steps."""
        return int(self._rows[rank, 1])

    def pids(self) -> list[int]:
        """The pids of this attempt's workers that have started."""
        return [b.pid for b in self.read() if b.pid]


class Watchdog:
    """Watches a run's `Beats` from the launching process; stops a stalled worker.

    A thread reads the rows every ``min(heartbeat / 4, 0.5)`` seconds; the first stalled
    worker (`stalled`) is recorded as the `verdict` and its process group killed (SIGKILL), so
    that its launcher sees it fail (and restarts the run where it may). Rows of an attempt
    with a verdict are not judged again. With `heartbeat` None it watches nothing.
    """

    def __init__(self, beats: Beats, heartbeat: float | None) -> None:
        self.beats, self.heartbeat = beats, heartbeat
        self.verdict: Beat | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Watchdog:
        if self.heartbeat is not None:
            self._thread = threading.Thread(
                target=self._loop, name="dualtrain-heartbeat", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        assert self.heartbeat is not None
        period = min(self.heartbeat / 4, 0.5)
        while not self._stop.wait(period):
            self.check(time.time())

    def check(self, now: float) -> Beat | None:
        """Judges the rows at `now`; a new verdict is recorded, its worker killed, returned."""
        assert self.heartbeat is not None
        beats = self.beats.read()
        if self.verdict is not None:
            beats = [b for b in beats if b.attempt > self.verdict.attempt]
        found = stalled(beats, now, self.heartbeat)
        if found is not None:
            self.verdict = found
            kill_group(found.pid)
        return found

    def what(self) -> str:
        """The verdict in words (for WorkerError)."""
        assert self.verdict is not None and self.heartbeat is not None
        return (
            f"no step for {self.heartbeat:g} s (heartbeat={self.heartbeat:g}) after step "
            f"{self.verdict.steps}: stalled, stopped by Multiverse"
        )


def kill_group(pid: int) -> None:
    """SIGKILL to the process group `pid` leads (a worker makes its own), else to `pid`."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
