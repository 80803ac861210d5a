"""The `dualtrain` command and its demo."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from dualtrain import __version__
from dualtrain.cli import main


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"dualtrain {__version__}"


def test_bad_step_count_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--steps", "0"])
    assert exit_info.value.code == 2
    assert "must be a positive int; got 0" in capsys.readouterr().err


def test_demo_shares_memory_trains_one_craft_in_both_and_crosses_its_checkpoint():
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    from dualtrain.demo import run

    out = io.StringIO()
    result = run(steps=12, console=Console(file=out, width=100))
    assert result["copies"] == 0
    torch_losses, jax_losses = result["torch_losses"], result["jax_losses"]
    assert len(torch_losses) == len(jax_losses) == 12
    assert torch_losses[-1] < torch_losses[0]  # it learns
    for a, b in zip(torch_losses, jax_losses, strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(a))
    assert result["checkpoint_max_difference"] <= 1e-5  # torch's checkpoint, loaded into JAX
    text = out.getvalue()
    assert "NumPy -> torch -> JAX -> NumPy" in text and "round trip bit-exact: True" in text
    assert "loaded into a fresh JAX module (0 skipped)" in " ".join(text.split())
    # The sweep: member i trains as the demo's single model with lrs[i], under both.
    from dualtrain import backends
    from dualtrain.demo import DemoNet, make_data

    lrs, sweep_torch = result["sweep_lrs"], np.asarray(result["sweep_torch_losses"])
    assert sweep_torch.shape == (12, len(lrs)) == np.shape(result["sweep_jax_losses"])
    np.testing.assert_allclose(sweep_torch, result["sweep_jax_losses"], rtol=1e-4, atol=1e-5)
    assert (sweep_torch[-1] < sweep_torch[0]).all()
    x, y, _ = make_data(0)
    for i in (0, len(lrs) - 1):
        alone, _ = backends.load_part("torch", "demo").train(
            DemoNet(classes=4), x, y, lr=lrs[i], steps=12, seed=0
        )
        np.testing.assert_allclose(sweep_torch[:, i], alone, rtol=1e-4, atol=1e-5)
    assert "a learning-rate sweep: 8 members in one BatchModule" in text
    # Fuel: the same Tank batches under both frameworks give the same curve, which learns.
    fuel_torch, fuel_jax = result["fuel_torch_losses"], result["fuel_jax_losses"]
    assert result["packed_rows"] == 256 and fuel_torch[-1] < fuel_torch[0] * 0.5
    for a, b in zip(fuel_torch, fuel_jax, strict=True):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(a))
    # The Tanks preloaded: every row decoded once over 7.5 epochs, within the budget.
    for stats in result["preload_stats"].values():
        assert stats["loads"] == 256 and stats["peak_resident_bytes"] <= stats["max_memory_size"]
    assert "PNG decodes for 1920 samples" in " ".join(text.split())
    # The compile ladder decided both: torch's forward and JAX's step, verified.
    ladders = result["ladders"]
    assert ladders["torch"].startswith("train: ") and ladders["jax"].startswith("call: ")
    assert "JIT" in ladders["jax"] or "EAGER" in ladders["jax"]
    assert "Compile ladder" in text
    # Multiverse: two torch processes and two JAX processes, the same curve, which learns.
    parallel_torch, parallel_jax = (
        result["multiverse_torch_losses"],
        result["multiverse_jax_losses"],
    )
    assert result["multiverse_nworld"] == 2 and len(parallel_torch) == len(parallel_jax) == 60
    np.testing.assert_allclose(parallel_torch, parallel_jax, rtol=1e-4, atol=1e-5)
    assert np.mean(parallel_torch[-5:]) < 0.5 * np.mean(parallel_torch[:5])  # it learns
    assert "Multiverse: 2 workers x 16 rows a step" in text


def test_python_dash_m_runs_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "dualtrain", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and __version__ in out.stdout
