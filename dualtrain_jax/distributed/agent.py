"""Multiverse's workers launched and supervised under JAX, whose ``jax.distributed`` has no agent.

`launch`, the adapter's `TRAITS.agent`, is the agent JAX lacks: it starts a `Launch`'s workers
with the ``spawn`` method (never ``fork``: a forked copy of a process that has JAX's threads
running can deadlock), each with the run's variables (`Launch.environment`), torchrun's, its
attempt and the address of a ``jax.distributed`` coordinator on a free localhost port in its
environment: set in ``os.environ`` while the worker starts, and only then. It waits on every
worker's process sentinel at once; a worker that reported its result ends with no failure
(`Launch.finished`: Multiverse stops one that hangs on its way out). At the first worker that
fails (an error it reported
exits with status 1; a crash, a SIGKILL, ends it without a word) it waits a moment for the
peers whose collectives fail because of it, then terminates the others (SIGTERM, then SIGKILL
after a grace period), reaps every process and, with restarts left, starts them all again.
Ctrl-C stops every worker the same way. What the workers report travels through the run's
folder (`dualtrain.multiverse.launch`), as under torch's agent: this one passes on exit codes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from dualtrain.multiverse.launch import GRACE, environment
from dualtrain.multiverse.seams import Launch
from dualtrain.multiverse.world import free_port, rank_environments

__all__ = ["launch"]

_COLLECT = 1.0  # seconds to let other failures come after the first: find the first cause


def launch(job: Launch) -> dict[int, int]:
    """Runs `job`'s workers on this host, spawned and watched here (`Agent`).

    `job.timeout` reaches the workers in their arguments (``jax.distributed`` bounds its
    joining itself); `job.log_dir` is not used: the workers' output is the launching
    process's.

    Returns:
        {} when every worker returned; else the last attempt's failed ranks and exit codes
        (a negative code: killed by that signal).

    Raises:
        KeyboardInterrupt: Ctrl-C; every worker is stopped first.
    """
    failed: dict[int, int] = {}
    for attempt in range(job.max_restarts + 1):
        failed = _attempt(job, attempt)
        if not failed:
            break
    return failed


def _attempt(job: Launch, attempt: int) -> dict[int, int]:
    """Spawns every worker of `attempt` and watches them; the ranks that failed, if any."""
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    coordinator = {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}"}
    try:
        for rank, env in enumerate(rank_environments(job.processes, attempt)):
            proc = ctx.Process(target=job.target, args=job.args,
                               name=f"dualtrain-multiverse-{rank}", daemon=False)  # fmt: skip
            procs.append(proc)  # before it starts: a Ctrl-C now still stops it
            # The variables must be in the worker's environment before its first import (a
            # script importing JAX at its top reads XLA_FLAGS then), so they are set here,
            # under a lock, and restored at once: the run's, the rank's, the coordinator's.
            with environment({**job.environment, **env, **coordinator}):
                proc.start()
        return _supervise(procs, lambda rank: job.finished(attempt, rank))
    finally:
        _stop(procs)


def _supervise(procs: list[Any], finished: Callable[[int], bool]) -> dict[int, int]:
    """Waits until every worker has ended, or until `_COLLECT` after the first failure.

    A rank that is `finished` (it reported its result) ends with no failure, whatever its
    exit code: Multiverse stops one that hangs on its way out (`ReportWatch`).
    """
    alive = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    failed: dict[int, int] = {}
    deadline: float | None = None
    while alive:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        for sentinel in wait(list(alive), timeout):
            rank = alive.pop(sentinel)
            procs[rank].join()
            if procs[rank].exitcode != 0 and not finished(rank):
                failed[rank] = procs[rank].exitcode
        if failed and deadline is None:
            deadline = time.monotonic() + _COLLECT
        if deadline is not None and time.monotonic() >= deadline:
            break
    return failed


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
