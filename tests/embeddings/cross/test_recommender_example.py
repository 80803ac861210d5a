"""examples/recommender.py runs on 2 workers as its docstring launches it, with equal results.

Spawned by Multiverse under torch and JAX, and by torchrun: each worker holds half of each
table, and the three runs (one model, one data split, Adam under torch and optax) agree. A
run whose rank 1 is SIGKILLed mid-epoch, with a restart allowed, resumes from the sharded
anchors of the last epoch and ends exactly where the uninterrupted run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = str(ROOT / "examples" / "recommender.py")
SMALL = ["--users", "400", "--items", "100", "--ratings", "20000", "--batch", "256",
         "--epochs", "2"]  # fmt: skip
LAUNCHES = {
    "torch spawned": [sys.executable, SCRIPT, "--backend", "torch"],
    "jax spawned": [sys.executable, SCRIPT, "--backend", "jax"],
    "torch torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc-per-node", "2", SCRIPT, "--backend", "torch"],
}  # fmt: skip


def launch(command: list[str], *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(
        [*command, *SMALL, *extra], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "epoch 1: loss" in done.stdout
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["stdout"] = done.stdout
    return result


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    return {how: launch(command) for how, command in LAUNCHES.items()}


def test_each_worker_holds_half_of_each_table(results):
    for result in results.values():
        assert result["rows_held"] == [
            {"users": [0, 200], "items": [0, 50]},
            {"users": [200, 400], "items": [50, 100]},
        ]


def test_the_launches_agree_and_learn(results):
    first = results["torch spawned"]
    for how, result in results.items():
        assert "resuming" not in result["stdout"]
        np.testing.assert_allclose(result["loss"], first["loss"], rtol=1e-4, err_msg=how)
        np.testing.assert_allclose(result["rmse"], first["rmse"], rtol=1e-4, err_msg=how)
    assert first["rmse"] < 1.0  # below the ratings' own spread: it learned


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_lost_worker_is_survived_from_the_sharded_anchors(results, backend, tmp_path):
    # 35 steps an epoch: rank 1 dies at step 5 of epoch 1, after epoch 0's anchors.
    lost = launch(LAUNCHES[f"{backend} spawned"], "--save", str(tmp_path), "--max-restarts",
                  "1", "--fail-at", "40")  # fmt: skip
    assert "attempt 1: resuming after epoch 0" in lost["stdout"]
    whole = results[f"{backend} spawned"]
    assert (lost["loss"], lost["rmse"]) == (whole["loss"], whole["rmse"])
