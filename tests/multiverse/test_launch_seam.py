"""What the core keeps of a launched run under either adapter's agent.

A worker that reported its result and hangs on its way out is stopped; a worker that exits
without one fails the run; the run's variables reach the workers, not the launching process;
`DistributedTraits` keeps its positional fields.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dualtrain import Multiverse, WorkerError
from dualtrain.multiverse import launch
from dualtrain.multiverse.heartbeat import RUN
from dualtrain.multiverse.seams import DistributedTraits
from dualtrain.multiverse.world import SPAWNED
from tests.multiverse import universes
from tests.multiverse.test_launch import gone, records

BACKENDS = pytest.mark.parametrize(
    "options", [{}, {"backend": "jax", "processes": 2}], ids=["torch", "jax"]
)
# Far below the many minutes the handler holds the GIL; far above a busy machine's spawns.
BOUND = 150.0
RUN_VARIABLES = (SPAWNED, RUN, "XLA_FLAGS", "OMP_NUM_THREADS", "TORCH_CPP_LOG_LEVEL", "RANK")


@BACKENDS
def test_a_reported_worker_holding_the_gil_on_its_way_out_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    monkeypatch.setattr(launch, "GRACE", 0.5)  # the launching process's grace (SIGTERM, SIGKILL)
    start = time.monotonic()
    assert Multiverse(universes.holds_the_gil_on_exit, 2, **options)(str(tmp_path)) == 0
    assert time.monotonic() - start < BOUND
    assert all(gone(r["pid"]) for r in records(tmp_path, 2))


@BACKENDS
def test_a_worker_that_exits_without_a_result_fails_the_run(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    with pytest.raises(WorkerError, match="rank 1 failed at step 0: exited without a result"):
        Multiverse(universes.exits_without_a_result, 2, **options)(str(tmp_path))
    assert all(gone(r["pid"]) for r in records(tmp_path, 2))


def test_a_jax_run_sets_its_variables_only_while_its_workers_start(tmp_path: Path) -> None:
    before = dict(os.environ)
    seen: dict[str, Any] = {}

    def check() -> None:
        end = time.monotonic() + BOUND
        while not (tmp_path / "running").exists() and time.monotonic() < end:
            time.sleep(0.05)
        seen["changed"] = [k for k in RUN_VARIABLES if os.environ.get(k) != before.get(k)]
        other = threading.Event()  # another launch may start its workers meanwhile

        def launch_another() -> None:
            with launch.environment({"DUALTRAIN_TEST_OTHER": "1"}):
                other.set()

        threading.Thread(target=launch_another, daemon=True).start()
        seen["lock free"] = other.wait(10)
        (tmp_path / "checked").touch()

    checker = threading.Thread(target=check)
    checker.start()
    try:
        result = Multiverse(universes.holds_the_run, 2, backend="jax", processes=2)(str(tmp_path))
    finally:
        (tmp_path / "checked").touch()
        checker.join()
    assert seen == {"changed": [], "lock free": True}
    assert result[RUN] is not None and "device_count=1" in result["XLA_FLAGS"]  # the workers'
    assert dict(os.environ) == before


def test_distributed_traits_keep_their_positional_fields_with_the_agent_by_keyword() -> None:
    def agent(job: Any) -> dict[int, int]:
        return {}

    traits = DistributedTraits("x", ("jit",), "'jit'", True, agent=agent)
    assert (traits.one_process_per_device, traits.agent) == (True, agent)
    with pytest.raises(TypeError):
        DistributedTraits("x", ("jit",), "'jit'", True)  # type: ignore[call-arg]


@BACKENDS
def test_a_rank_returning_well_after_its_peer_is_waited_for(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    # torch's agent takes each return value and keeps a returned worker waiting until every
    # rank has returned. A worker ended while it waited there (its exit clock once started at
    # its report) left the agent waiting forever; one stopped there failed the run.
    out: dict[str, Any] = {}

    def run() -> None:
        out["result"] = Multiverse(universes.one_rank_later, 2, **options)(
            str(tmp_path), launch.GRACE + 3
        )

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(BOUND)
    assert out == {"result": 0}
    assert all(gone(r["pid"]) for r in records(tmp_path, 2))


def test_an_attempt_settles_only_once_every_rank_has_started_and_reported(
    tmp_path: Path,
) -> None:
    # A rank whose worker had not started yet (pid 0) was left out, so the attempt counted
    # as settled when the other rank reported, and that rank, rightly waiting for its slow
    # peer, was stopped (seen in CI under load).
    from dualtrain.multiverse.heartbeat import Beat

    class Rows:  # the run's heartbeat table as the watch reads it: one row a rank
        def __init__(self) -> None:
            self.rows: list[Beat] = []

        def read(self) -> list[Beat]:
            return self.rows

    import subprocess
    import sys

    # Two live children of this process stand for the workers (the watch asks the kernel
    # whether they still run).
    workers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)
    ]
    try:
        table = Rows()
        watch = launch.ReportWatch(tmp_path, table)
        launch.report_result(launch.FileReport(tmp_path, 0, 0), 3, 7)
        table.rows = [Beat(0, workers[0].pid, 3, 0.0, 0, 0), Beat(1, 0, 0, 0.0, 0, 0)]
        for _ in range(3):
            watch.poll()
        assert watch._settled == {}  # rank 1 has not even started
        table.rows[1] = Beat(1, workers[1].pid, 0, 0.0, 0, 0)
        for _ in range(3):
            watch.poll()
        assert watch._settled == {}  # started, not reported
        launch.report_result(launch.FileReport(tmp_path, 0, 1), 3, None)
        for _ in range(2):
            watch.poll()
        assert list(watch._settled) == [0]
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
