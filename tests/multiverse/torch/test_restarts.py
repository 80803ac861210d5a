"""Surviving a lost worker under torch: restarts from the last anchor, a stalled rank named.

Multiverse launches torch workers through torch's elastic agent; `max_restarts` is the
agent's. The laws: a worker SIGKILLed mid-step under restarts, resumed from the last
anchor, ends equal to an uninterrupted run; a worker that stops stepping is named by its
own rank, not by the peer whose collective would time out.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dualtrain import Multiverse, WorkerError
from dualtrain.multiverse.world import free_port
from tests.multiverse.torch import restart_universes as ru

STEPS, EVERY, KILL_AT = 6, 2, 3
ROOT = Path(__file__).resolve().parents[3]


def test_a_worker_killed_mid_step_restarts_from_the_last_anchor_to_the_same_model(
    tmp_path: Path,
) -> None:
    (tmp_path / "whole").mkdir()
    (tmp_path / "killed").mkdir()
    whole = Multiverse(ru.resumes, 2)(str(tmp_path / "whole"), STEPS, EVERY, None)
    resumed = Multiverse(ru.resumes, 2, max_restarts=1)(
        str(tmp_path / "killed"), STEPS, EVERY, KILL_AT
    )
    assert (tmp_path / "killed" / "killed").exists()  # rank 1 did die, once
    assert (whole["restarts"], resumed["restarts"]) == (0, 1)
    assert resumed["start"] == KILL_AT - KILL_AT % EVERY  # from the last anchor before it
    # Exactly: the same float operations in the same order (gloo's sum of two is exact in
    # either order; the anchor holds the model and Adam's state bit for bit).
    assert whole["params"].keys() == resumed["params"].keys()
    for name, value in whole["params"].items():
        np.testing.assert_array_equal(resumed["params"][name], value, err_msg=name)


@pytest.mark.parametrize("learner", [True, False], ids=["learner", "synced-forward"])
def test_a_stalled_worker_is_named_by_its_own_rank(tmp_path: Path, learner: bool) -> None:
    # The message is the heartbeat's, naming rank 1: not rank 0's collective timeout (300 s).
    with pytest.raises(WorkerError, match=r"rank 1 failed at step 2: no step for 3 s") as caught:
        Multiverse(ru.stalls, 2, heartbeat=3)(str(tmp_path), 1, learner)
    assert (caught.value.rank, caught.value.step) == (1, 2)


def test_under_torchrun_max_restarts_the_run_resumes_the_same_way(tmp_path: Path) -> None:
    """torchrun's agent restarts the workers; Multiverse reads the attempt from its variables."""
    (tmp_path / "whole").mkdir()
    (tmp_path / "torchrun").mkdir()
    whole = Multiverse(ru.resumes, 2)(str(tmp_path / "whole"), STEPS, EVERY, None)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--max-restarts", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--monitor-interval", "0.1",
        "-m", "tests.multiverse.torch.torchrun_resume",
        str(tmp_path / "torchrun"), str(STEPS), str(EVERY), str(KILL_AT),
    ]  # fmt: skip
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "torchrun" / "killed").exists()
    saved = np.load(tmp_path / "torchrun" / "params.npz")
    assert int(saved["restarts"]) == 1
    for name, value in whole["params"].items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
