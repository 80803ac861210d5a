"""examples/multiverse_train.py runs as docs/multiverse.md launches it, with equal results.

The same training (the same weights, data and global batches) launched four ways: spawned by
Multiverse under torch and JAX, by torchrun under torch and JAX, and JAX over four devices
of one process. Each run prints rank 0's result as JSON on its last line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "examples" / "multiverse_train.py")
# --standalone: a free port of torchrun's own choosing; its default, 29500 for every run,
# made two launches at once (pytest-xdist's workers, another job) refuse or join each other.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

LAUNCHES = {
    "torch spawned": [sys.executable, SCRIPT, "--backend", "torch", "--nworld", "2"],
    "torch torchrun": [*TORCHRUN, SCRIPT, "--backend", "torch"],
    "jax jax.distributed": [sys.executable, SCRIPT, "--backend", "jax", "--nworld", "2",
                            "--processes", "2"],
    "jax torchrun": [*TORCHRUN, SCRIPT, "--backend", "jax"],
}  # fmt: skip


def launch(command: list[str], tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the script's own devices
    done = subprocess.run(
        [*command, "--epochs", "2", "--out", str(tmp_path)], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "epoch 1: loss" in done.stdout
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def spawned_torch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return launch(LAUNCHES["torch spawned"], tmp_path_factory.mktemp("torch"))


@pytest.mark.parametrize("how", [k for k in LAUNCHES if k != "torch spawned"])
def test_each_launch_trains_the_same(how: str, spawned_torch: dict, tmp_path: Path) -> None:
    result = launch(LAUNCHES[how], tmp_path)
    assert (result["nworld"], result["steps"]) == (2, spawned_torch["steps"])
    np.testing.assert_allclose(result["losses"], spawned_torch["losses"], rtol=1e-5)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "CNN-1.safetensors", "CNN-2.safetensors"
    ]  # fmt: skip
    assert spawned_torch["losses"][1] < spawned_torch["losses"][0]


def test_jax_over_four_devices_of_one_process(tmp_path: Path) -> None:
    result = launch([sys.executable, SCRIPT, "--backend", "jax", "--nworld", "4"], tmp_path)
    assert result["nworld"] == 4 and result["losses"][1] < result["losses"][0]
