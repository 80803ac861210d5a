"""torch path == JAX path, and checkpoints that move between them."""

from __future__ import annotations

import numpy as np
import optax
import pytest
import torch
from hypothesis import given, settings

import dualtrain
from dualtrain.checkpoint import CheckpointError
from dualtrain_jax import attach as jax_attach
from dualtrain_torch import attach as torch_attach
from tests.embeddings.runs import batches, run_jax, run_torch, store

PAIRS = {
    "adam": ((torch.optim.Adam, {"lr": 0.05}), optax.adam(0.05)),
    "sgd-momentum": ((torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}), optax.sgd(0.1, 0.9)),
    # optax adds eps inside the square root and starts the sum at 0.1 unless told
    "adagrad": (
        (torch.optim.Adagrad, {"lr": 0.1, "eps": 0.0, "initial_accumulator_value": 0.1}),
        optax.adagrad(0.1, initial_accumulator_value=0.1, eps=0.0),
    ),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("mode", ["lazy", "exact"])
@settings(max_examples=10)
@given(steps=batches())
def test_torch_path_equals_jax_path(name, mode, steps):
    (cls, kw), tx = PAIRS[name]
    a, _ = run_torch(cls, kw, mode, steps)
    b, _ = run_jax(tx, mode, steps)
    np.testing.assert_allclose(a.table, b.table, rtol=1e-5, atol=1e-5)
    for slot in a.state:
        np.testing.assert_allclose(a.state[slot], b.state[slot], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["lazy", "exact"])
def test_a_run_saved_under_torch_resumes_under_jax(tmp_path, mode):
    steps = [np.array([1, 2, 2]), np.array([3, 1]), np.array([0, 0, 4]), np.array([2, 5])]
    whole, _ = run_torch(torch.optim.Adam, {"lr": 0.05}, mode, steps)
    _, first = run_torch(torch.optim.Adam, {"lr": 0.05}, mode, steps[:2])
    tm = dualtrain.TimeMachine(save_path=tmp_path)
    path = tm.drop_embeddings(first, "emb", extra={"epoch": 1})
    second = jax_attach(store(), optax.adam(0.05), mode=mode)
    manifest = tm.to_embeddings(second, path)
    assert manifest["extra"] == {"epoch": 1} and second.steps == 2
    import jax

    from tests.embeddings.runs import coef

    for k, ids in enumerate(steps[2:], start=2):
        e = second.fetch(ids)
        c = coef(k, len(ids))
        second.step(jax.grad(lambda e, c=c: (e * c).sum() + 0.5 * (e**2).sum())(e))
    second.settle()
    second.flush()
    np.testing.assert_allclose(second.store.table, whole.table, rtol=1e-5, atol=1e-6)


def test_big_tables_are_saved_in_chunks(tmp_path):
    from dualtrain.checkpoint.embeddings import CHUNK

    s = dualtrain.EmbeddingStore(CHUNK + 5, 2)
    rows = torch_attach(s, torch.optim.SGD, lr=0.1, momentum=0.9)
    rows.fetch(np.array([0, CHUNK + 4])).sum().backward()
    rows.step()
    path = dualtrain.TimeMachine(save_path=tmp_path).drop_embeddings(rows, "big")
    import safetensors

    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert sorted(f.keys()) == [
            "state.momentum_buffer.0",
            "state.momentum_buffer.1",
            "weight.0",
            "weight.1",
        ]
    other = dualtrain.EmbeddingStore(CHUNK + 5, 2, seed=9)
    dualtrain.TimeMachine(ckpt_path=tmp_path).to_embeddings(
        jax_attach(other, optax.sgd(0.1, 0.9)), "big.safetensors"
    )
    np.testing.assert_array_equal(other.table, s.table)
    np.testing.assert_array_equal(other.state["momentum_buffer"], s.state["momentum_buffer"])
    assert not list(tmp_path.glob(".*tmp"))


def test_loading_refuses_a_table_of_another_shape_or_missing_state(tmp_path):
    rows = torch_attach(store(), torch.optim.SGD, lr=0.1)
    path = dualtrain.TimeMachine(save_path=tmp_path).drop_embeddings(rows, "plain")
    tm = dualtrain.TimeMachine(ckpt_path=tmp_path)
    with pytest.raises(CheckpointError, match=r"holds the state of torch\.optim\.SGD"):
        tm.to_embeddings(torch_attach(store(), torch.optim.Adam, lr=0.1), path)
    with pytest.raises(CheckpointError, match="format 'dualtrain-embeddings/4'; this reads"):
        dualtrain.TimeMachine().to(_realized(), path)
    with pytest.raises(CheckpointError, match="table"):
        tm.to_embeddings(
            torch_attach(dualtrain.EmbeddingStore(5, 3), torch.optim.SGD, lr=0.1), path
        )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_tables_train_alike_under_both(dtype):
    ids = np.array([1, 1, 2])
    a = dualtrain.EmbeddingStore(10, 4, dtype=dtype)
    rows = torch_attach(a, torch.optim.Adam, lr=0.1)
    rows.fetch(ids).float().sum().backward()
    rows.step()
    rows.flush()
    b = dualtrain.EmbeddingStore(10, 4, dtype=dtype)
    jrows = jax_attach(b, optax.adam(0.1))
    e = jrows.fetch(ids)
    jrows.step(np.ones(e.shape, e.dtype))
    jrows.flush()
    assert a.table.dtype == b.table.dtype and a.state["exp_avg"].dtype == a.table.dtype
    np.testing.assert_allclose(a.table.astype(np.float32), b.table.astype(np.float32), atol=1e-3)
    assert not np.array_equal(a.table, dualtrain.EmbeddingStore(10, 4, dtype=dtype).table)


def test_a_float64_store_needs_x64_under_jax():
    from dualtrain.errors import DtypeError

    with pytest.raises(DtypeError, match="jax_enable_x64"):
        jax_attach(dualtrain.EmbeddingStore(10, 4, dtype="float64"), optax.adam(0.1))


def _realized():
    from dualtrain_torch.craft import realize

    class Tiny(dualtrain.Craft):
        def __init__(self):
            super().__init__("TINY")
            self.fc = dualtrain.dock.Dense(2, 2)

        def run(self, x):
            return self.fc(x)

    return realize(Tiny(), seed=0)
