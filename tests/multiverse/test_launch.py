"""Multiverse's launcher: workers spawned with torchrun's variables, failures stop them all.

The universes here join no run, so these tests cost a Python start per worker, not a
framework import.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dualtrain import ArgumentError, Multiverse, WorkerError
from dualtrain.multiverse import main_decorator
from tests.multiverse import universes

ROOT = Path(__file__).resolve().parents[2]
# A bound on a whole run (spawns, imports, stops) far above what a busy machine takes, and
# far below the hangs it guards against (workers that sleep an hour or wait forever).
HANG = 600.0


def records(folder: Path, n: int, wait: float = 120.0) -> list[dict[str, Any]]:
    end = time.monotonic() + wait
    while time.monotonic() < end:
        found = sorted(folder.glob("rank*.json"))
        if len(found) == n:
            return [json.loads(p.read_text()) for p in found]
        time.sleep(0.05)
    raise AssertionError(f"{len(list(folder.glob('rank*.json')))} of {n} workers started")


def gone(pid: int, wait: float = 30.0) -> bool:
    """Whether process `pid` is gone (or a zombie nobody reaps) within `wait` seconds (the
    answer comes as soon as it is gone)."""
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        status = Path(f"/proc/{pid}/stat")
        if status.exists() and status.read_text().split(")")[-1].split()[0] == "Z":
            return True
        time.sleep(0.05)
    return False


def test_workers_see_their_place_and_rank_0_returns(tmp_path: Path) -> None:
    result = Multiverse(universes.where, 3)(str(tmp_path))
    assert result == {"rank": 0, "squares": [0, 1, 4, 9]}
    seen = records(tmp_path, 3)
    assert [r["rank"] for r in seen] == [0, 1, 2]
    assert all(r["nworld"] == 3 and r["processes"] == 3 and r["world"] == "3" for r in seen)
    assert [r["is_main"] for r in seen] == [True, False, False]
    assert [r["local_rank"] for r in seen] == [0, 1, 2]
    if "OMP_NUM_THREADS" not in os.environ:  # shared cores, not multiplied
        assert all(int(r["omp"]) == max(1, (os.cpu_count() or 1) // 3) for r in seen)
    assert all(gone(r["pid"]) for r in seen)


@pytest.mark.parametrize(
    ("how", "said"),
    [("raise", "ValueError: loss is nan at rank 1"), ("kill", "killed by SIGKILL"),
     ("exit", "exited with code 3")],
)  # fmt: skip
def test_a_failing_worker_stops_the_others_and_is_named(
    tmp_path: Path, how: str, said: str
) -> None:
    start = time.monotonic()
    with pytest.raises(WorkerError, match="rank 1 failed at step 2") as caught:
        Multiverse(universes.fails, 3)(str(tmp_path), 1, 2, how)
    assert said in str(caught.value)
    assert (caught.value.rank, caught.value.step) == (1, 2)
    assert time.monotonic() - start < HANG  # the other ranks were not waited for
    for record in records(tmp_path, 3):
        assert gone(record["pid"]), f"rank {record['rank']} is still running"


def test_an_unpicklable_result_is_an_error_naming_rank_0() -> None:
    with pytest.raises(WorkerError, match=r"rank 0 .*could not be sent"):
        Multiverse(universes.unpicklable, 2)()


def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "-m", "tests.multiverse.waiting_run", str(tmp_path)], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        seen = records(tmp_path, 2)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
    finally:
        run.kill()
        run.communicate()  # reaped and its pipes closed, whatever happened above
    assert run.returncode == 130, err
    assert "interrupted" in out
    assert all(gone(r["pid"]) for r in seen)


def test_workers_of_a_killed_parent_exit(tmp_path: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "-m", "tests.multiverse.waiting_run", str(tmp_path)], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        seen = records(tmp_path, 2)
    finally:
        run.kill()
        run.wait()
    assert all(gone(r["pid"]) for r in seen)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"nworld": 0}, "nworld"), ({"nworld": True}, "nworld"), ({"backend": "tf"}, "backend"),
     ({"timeout": 0}, "timeout"), ({"timeout": float("inf")}, "timeout"),
     ({"engine": "pmap"}, "engine"), ({"backend": "jax", "engine": "vmap"}, "engine"),
     ({"nworld": 4, "processes": 2}, "processes"),
     ({"backend": "jax", "nworld": 4, "processes": 3}, "processes"),
     ({"bucket_size": 25}, "bucket_size"),
     ({"backend": "jax", "bucket_cap_mb": 25}, "bucket_cap_mb")],
)  # fmt: skip
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ArgumentError, match=rf"^{named} must be"):
        Multiverse(universes.where, **kwargs)


def test_a_universe_spawned_workers_cannot_import_is_refused_before_any_start() -> None:
    with pytest.raises(ArgumentError, match="top level of an importable module"):
        Multiverse(lambda mv: None, 2)()
    with pytest.raises(ArgumentError, match="picklable"):
        Multiverse(universes.where, 2)(lambda: None)


def test_executor_runs_a_main_function_on_one_worker_without_a_multiverse() -> None:
    seen: list[Any] = []

    @main_decorator
    def launch(mv: Multiverse | None, value: int) -> int:
        assert mv is not None
        seen.append((mv.nworld, mv.rank, mv.is_main))
        return value * 2

    assert launch(None, 21) == 42
    assert launch(4) == 8  # the brochure's launch() with an argument: not taken for mv
    mv = Multiverse(launch, 1)
    assert launch(mv, 5) == 10
    assert seen == [(1, 0, True)] * 3
    with pytest.raises(ArgumentError, match="function"):
        main_decorator(3)  # type: ignore[arg-type]
    # the old spelling: the same decorator, with a warning naming both new ones
    with pytest.warns(DeprecationWarning, match="main_decorator.*compat.nebulae.law"):
        old = Multiverse.Executor(lambda mv, value: value + 1)
    assert old(1) == 2


def test_the_device_count_flag_goes_first_and_once() -> None:
    """XLA stops reading XLA_FLAGS at a token it cannot parse; a flag after it is lost."""
    from dualtrain.multiverse.devices import with_devices

    flags = "--xla_force_host_platform_device_count=8 intra_op_parallelism_threads=1"
    assert with_devices(flags, 2) == (
        "--xla_force_host_platform_device_count=2 intra_op_parallelism_threads=1"
    )
    assert with_devices("", 3) == "--xla_force_host_platform_device_count=3"


def test_a_result_holding_a_torch_tensor_arrives_whole() -> None:
    import torch

    result = Multiverse(universes.tensor, 2)()
    assert torch.equal(result["t"], torch.arange(6, dtype=torch.float32).reshape(2, 3))


def test_a_worker_that_hangs_after_reporting_is_stopped_not_waited_for(tmp_path: Path) -> None:
    start = time.monotonic()
    assert Multiverse(universes.hangs_on_exit, 2)(str(tmp_path)) == 0
    assert time.monotonic() - start < HANG  # not the hour it hangs for
    assert all(gone(r["pid"]) for r in records(tmp_path, 2))


def test_a_worker_that_fails_on_its_way_out_after_reporting_is_done(tmp_path: Path) -> None:
    # Its result is in: a teardown's status (here multiprocessing's finalizers exit 1) is not
    # the run's, as a teardown that hangs is not.
    assert Multiverse(universes.fails_on_its_way_out, 2)(str(tmp_path)) == 0
    assert all(gone(r["pid"]) for r in records(tmp_path, 2))


def test_restarts_run_every_worker_again_and_the_last_attempts_failure_is_named(
    tmp_path: Path,
) -> None:
    with pytest.raises(WorkerError, match="rank 1 failed at step 2: ValueError: attempt 1 fails"):
        Multiverse(universes.fails_every_attempt, 2, max_restarts=1)(str(tmp_path))
    for rank in (0, 1):
        assert (tmp_path / f"attempts{rank}").read_text().split() == ["0", "1"]


def test_the_children_of_a_failed_worker_are_stopped_too(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match="rank 1 failed at step 0: RuntimeError"):
        Multiverse(universes.fails_with_child, 2)(str(tmp_path))
    children = [int(p.read_text()) for p in tmp_path.glob("child*")]
    assert len(children) == 2
    assert all(gone(pid) for pid in children)
    assert all(gone(r["pid"]) for r in records(tmp_path, 2))


def test_a_reported_worker_that_ignores_sigterm_is_killed(tmp_path: Path, monkeypatch) -> None:
    from dualtrain.multiverse import launch

    monkeypatch.setattr(launch, "GRACE", 0.5)
    start = time.monotonic()
    assert Multiverse(universes.ignores_term_and_hangs, 2)(str(tmp_path)) == 0
    assert time.monotonic() - start < HANG  # not the hour it hangs for
    assert all(gone(r["pid"]) for r in records(tmp_path, 2))


def test_reading_where_it_stands_before_the_call_still_spawns(tmp_path: Path) -> None:
    mv = Multiverse(universes.where, 3)
    assert (mv.is_main, mv.rank, mv.local_rank, mv.nworld, mv.processes) == (True, 0, 0, 3, 3)
    mv(str(tmp_path))
    assert [r["rank"] for r in records(tmp_path, 3)] == [0, 1, 2]
    with pytest.raises(ArgumentError, match="call mv"):
        mv.init()  # the parent is no worker of a 3-process run


def test_a_multiverse_subclass_workers_cannot_import_is_refused_before_any_start() -> None:
    class Local(Multiverse):  # defined in a function: spawned workers cannot import it
        pass

    with pytest.raises(ArgumentError, match=r"define .*Local at the top level"):
        Local(universes.where, 2)()


def test_each_adapter_declares_the_agent_its_runs_are_launched_by() -> None:
    from dualtrain.multiverse.seams import distributed_traits
    from dualtrain_jax.distributed import agent as jax_agent
    from dualtrain_torch.distributed import agent as torch_agent

    assert distributed_traits("torch").agent is torch_agent.launch
    assert distributed_traits("jax").agent is jax_agent.launch


def test_a_jax_run_is_spawned_by_the_jax_agent_and_a_death_is_named(tmp_path: Path) -> None:
    (tmp_path / "ok").mkdir()
    (tmp_path / "dies").mkdir()
    options = {"backend": "jax", "processes": 2}
    result = Multiverse(universes.where, 2, **options)(str(tmp_path / "ok"))
    assert result == {"rank": 0, "squares": [0, 1, 4, 9]}
    seen = records(tmp_path / "ok", 2)
    assert [(r["rank"], r["world"]) for r in seen] == [(0, "2"), (1, "2")]  # the agent's
    with pytest.raises(WorkerError, match="rank 1 failed at step 2: killed by SIGKILL"):
        Multiverse(universes.fails, 2, **options)(str(tmp_path / "dies"), 1, 2, "kill")
    assert all(gone(r["pid"]) for r in [*seen, *records(tmp_path / "dies", 2)])
