"""Universes for the launcher's tests: spawned workers import them by name.

They do not join a run (no torch, no JAX): they test the spawning, the reports and the
stopping. Each writes its pid to ``folder`` so the tests can check that none is left.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any


def _note(mv: Any, folder: str) -> None:
    record = {"rank": mv.rank, "nworld": mv.nworld, "local_rank": mv.local_rank,
              "processes": mv.processes, "is_main": mv.is_main, "pid": os.getpid(),
              "omp": os.environ.get("OMP_NUM_THREADS"),
              "world": os.environ.get("WORLD_SIZE")}  # fmt: skip
    tmp = Path(folder) / f".rank{mv.rank}.json"
    tmp.write_text(json.dumps(record))
    tmp.rename(Path(folder) / f"rank{mv.rank}.json")


def where(mv: Any, folder: str) -> Any:
    """Writes where this worker stands; returns its rank and the squares of range(4)."""
    _note(mv, folder)
    return {"rank": mv.rank, "squares": [i * i for i in range(4)]}


def _wait_for_notes(mv: Any, folder: str) -> None:
    """Waits until every worker has written its note: a failure stops those still starting."""
    while len(list(Path(folder).glob("rank*.json"))) < mv.processes:
        time.sleep(0.05)


def fails(mv: Any, folder: str, rank: int, steps: int, how: str) -> None:
    """Rank `rank` takes `steps` steps, then raises or kills itself; the others wait forever."""
    _note(mv, folder)
    if mv.rank != rank:
        while True:
            time.sleep(0.05)
    _wait_for_notes(mv, folder)
    for _ in range(steps):
        mv._on_step()
    if how == "raise":
        raise ValueError(f"loss is nan at rank {rank}")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exit":
        os._exit(3)
    raise AssertionError(how)


def waits(mv: Any, folder: str) -> None:
    """Every worker waits forever (the test stops them)."""
    _note(mv, folder)
    while True:
        time.sleep(0.05)


def unpicklable(mv: Any) -> Any:
    """Rank 0 returns what cannot be pickled."""
    return (lambda: None) if mv.is_main else None


def tensor(mv: Any) -> Any:
    """Rank 0 returns a torch tensor (sent by value: the worker exits after)."""
    import torch

    return {"t": torch.arange(6, dtype=torch.float32).reshape(2, 3) * (mv.rank + 1)}


def hangs_on_exit(mv: Any, folder: str) -> Any:
    """Returns, then hangs on its way out (as a gloo group's teardown can)."""
    import atexit

    _note(mv, folder)
    atexit.register(time.sleep, 3600)
    return mv.rank


def fails_with_child(mv: Any, folder: str) -> None:
    """Every worker starts a child process that would sleep 10 minutes; rank 1 then raises."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (Path(folder) / f"child{mv.rank}").write_text(str(child.pid))
    _note(mv, folder)
    if mv.rank == 1:
        _wait_for_notes(mv, folder)  # each worker notes itself after its child's pid
        raise RuntimeError("rank 1 gives up")
    while True:
        time.sleep(0.05)


def ignores_term_and_hangs(mv: Any, folder: str) -> Any:
    """Returns, then hangs on its way out and ignores SIGTERM."""
    import atexit

    _note(mv, folder)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    atexit.register(time.sleep, 3600)
    return mv.rank


def fails_on_its_way_out(mv: Any, folder: str) -> Any:
    """Returns; then multiprocessing's exit finalizers end the process with status 1."""
    import sys
    from multiprocessing import util

    _note(mv, folder)
    util.Finalize(None, sys.exit, args=(1,), exitpriority=100)
    return mv.rank


def fails_every_attempt(mv: Any, folder: str) -> None:
    """Each worker notes its attempt; rank 1 then raises (once rank 0 has), in every attempt."""
    with open(Path(folder) / f"attempts{mv.rank}", "a") as f:
        f.write(f"{mv.restart_count}\n")
    for _ in range(mv.restart_count + 1):
        mv._on_step()
    if mv.rank == 1:
        other = Path(folder) / "attempts0"  # rank 0 has noted this attempt: then fail
        while not other.exists() or len(other.read_text().split()) <= mv.restart_count:
            time.sleep(0.05)
        raise ValueError(f"attempt {mv.restart_count} fails")
    while True:
        time.sleep(0.05)


def holds_the_gil_on_exit(mv: Any, folder: str) -> Any:
    """Returns, then an ``atexit`` handler holds the GIL for many minutes (a regular
    expression backtracking in C): the worker's own `exit_soon` thread cannot run."""
    import atexit
    import re

    _note(mv, folder)
    atexit.register(re.match, r"(a+)+$", "a" * 34 + "!")
    return mv.rank


def exits_without_a_result(mv: Any, folder: str) -> Any:
    """Rank 1 exits with status 0 without a word; rank 0 returns 3 seconds later."""
    _note(mv, folder)
    if mv.rank == 1:
        os._exit(0)
    time.sleep(3)
    return mv.rank


def holds_the_run(mv: Any, folder: str) -> Any:
    """Rank 0 tells it runs (file ``running``), then waits for ``checked`` (a minute at most);
    returns the run's variables as the worker saw them."""
    _note(mv, folder)
    if mv.rank == 0:
        (Path(folder) / "running").touch()
        end = time.monotonic() + 60
        while not (Path(folder) / "checked").exists() and time.monotonic() < end:
            time.sleep(0.05)
    return {k: os.environ.get(k) for k in ("DUALTRAIN_MULTIVERSE_RUN", "XLA_FLAGS")}


def one_rank_later(mv: Any, folder: str, seconds: float) -> Any:
    """Rank 1 returns `seconds` after rank 0 (a last checkpoint, a final evaluation)."""
    _note(mv, folder)
    if mv.rank == 1:
        time.sleep(seconds)
    return mv.rank
