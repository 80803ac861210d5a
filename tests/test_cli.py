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


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--lr", "-1"], "must be a positive number; got -1"),
        (["--lr", "nan"], "must be a positive number; got nan"),
        (["--seed", "-1"], "must be an int >= 0; got -1"),
    ],
)
def test_bad_demo_values_are_refused_before_anything_runs(capsys, args, says):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *args])
    assert exit_info.value.code == 2 and says in capsys.readouterr().err


def test_an_out_that_is_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "f")])
    assert "must be a folder" in capsys.readouterr().err


def test_bad_backend_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--backend", "tensorflow"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err


@pytest.mark.slow
def test_the_quick_demo_runs_the_whole_pipeline_and_writes_its_outputs(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    from dualtrain.demo import run

    out = io.StringIO()
    result = run(steps=12, console=Console(file=out, width=100), out=tmp_path, quick=True)
    text = " ".join(out.getvalue().split())
    assert result["copies"] == 0 and "round trip bit-exact: True" in text
    # The pipeline: both frameworks learn the shapes well above chance (25%) from the same
    # batches, their curves agree, and every held-out row is evaluated once.
    pipe = result["pipeline"]
    for name in ("torch", "jax"):
        assert len(pipe["accuracy"][name]) == 4 and pipe["accuracy"][name][-1] >= 0.6
        assert pipe["logits"][name].shape == (96, 4)
        assert pipe[f"{name}_preload"]["loads"] == 512  # each row decoded once in 4 epochs
    assert pipe["crossing"]["agreement"] == 1.0 and pipe["crossing"]["max_difference"] < 1e-4
    assert "held-out predictions agree on 100.0% of rows" in text
    assert "held-out accuracy" in text and f"loss curves: {tmp_path}" in text
    # What it wrote: the packs, the DashBoard's CSV and PNG curves, the checkpoint.
    from PIL import Image

    assert (tmp_path / "data" / "train.h5").exists() and (tmp_path / "data" / "test.h5").exists()
    logs = tmp_path / "aerolog"
    with Image.open(logs / "loss.png") as png:
        assert png.format == "PNG"
    rows = (logs / "metrics.csv").read_text().splitlines()
    assert rows[0] == "stage,epoch,mile,mpe,key,value"
    assert sum(r.startswith("torch train,") for r in rows) == 4 * 16  # every step's loss
    assert (logs / "accuracy.png").exists() and (logs / "history.csv").exists()
    # The same batches from the same weights: epoch 1's mean loss agrees (Adam then lets
    # float32 rounding grow, so later epochs only come close).
    import csv

    with (logs / "epochs.csv").open() as f:
        means = {(r["stage"], int(r["epoch"])): float(r["mean"]) for r in csv.DictReader(f)}
    assert means[("torch train", 1)] == pytest.approx(means[("jax train", 1)], rel=1e-4)
    assert [p.suffix for p in (tmp_path / "ckpt").iterdir()] == [".safetensors"]
    # The one-Craft comparison: the same maths, the same losses.
    for a, b in zip(result["torch_losses"], result["jax_losses"], strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(a))
    # The sweep: member i trains as the demo's single model with lrs[i], under both.
    from dualtrain import backends
    from dualtrain.demo import DemoNet, make_data

    lrs, sweep_torch = result["sweep_lrs"], np.asarray(result["sweep_torch_losses"])
    assert sweep_torch.shape == (12, len(lrs)) == np.shape(result["sweep_jax_losses"])
    np.testing.assert_allclose(sweep_torch, result["sweep_jax_losses"], rtol=1e-4, atol=1e-5)
    x, y, _ = make_data(0)
    alone, _ = backends.load_part("torch", "demo").train(
        DemoNet(classes=4), x, y, lr=lrs[0], steps=12, seed=0
    )
    np.testing.assert_allclose(sweep_torch[:, 0], alone, rtol=1e-4, atol=1e-5)
    # Embeddings and Multiverse: the same curve under both, which learns.
    np.testing.assert_allclose(result["embed_torch_losses"], result["embed_jax_losses"],
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    parallel_torch = result["multiverse_torch_losses"]
    assert result["multiverse_nworld"] == 2 and len(parallel_torch) == 30
    np.testing.assert_allclose(parallel_torch, result["multiverse_jax_losses"], rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    assert np.mean(parallel_torch[-5:]) < 0.7 * np.mean(parallel_torch[:5])
    assert "demo finished in" in text


def test_one_backend_runs_alone(tmp_path):
    pytest.importorskip("torch")
    from dualtrain.demo import run

    out = io.StringIO()
    result = run(console=Console(file=out, width=100), out=tmp_path, quick=True, epochs=1,
                 backend="torch", nworld=1)  # fmt: skip
    assert result["names"] == ("torch",) and "copies" not in result
    assert set(result["pipeline"]["accuracy"]) == {"torch"}
    assert "crossing" not in result["pipeline"]
    assert "sweep_jax_losses" not in result and "embed_torch_losses" in result
    shown = out.getvalue().split("FuelGenerator -> Tank")[1]  # past the backends table
    assert "JAX" not in shown and "jax" not in shown


def test_python_dash_m_runs_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "dualtrain", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and __version__ in out.stdout
