"""examples/recommender.py runs on 2 workers as its docstring launches it, with equal results.

Spawned by Multiverse under torch and JAX, and by torchrun: each worker holds half of each
table, and the three runs (one model, one data split, Adam under torch and optax) agree.
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


def launch(command: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(
        [*command, *SMALL], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "epoch 1: loss" in done.stdout
    return json.loads(done.stdout.strip().splitlines()[-1])


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
        np.testing.assert_allclose(result["loss"], first["loss"], rtol=1e-4, err_msg=how)
        np.testing.assert_allclose(result["rmse"], first["rmse"], rtol=1e-4, err_msg=how)
    assert first["rmse"] < 1.0  # below the ratings' own spread: it learned
