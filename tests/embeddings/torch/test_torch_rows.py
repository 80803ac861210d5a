"""The torch attachment's laws: lazy == the touched-rows reference and SparseAdam, exact ==
dense training, nothing lost on repeated ids, untouched rows untouched, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import dualtrain
from dualtrain.errors import ArgumentError, DtypeError
from dualtrain_torch import attach
from tests.embeddings.runs import ROWS, batches, dense_torch, run_torch, store

OPTIMIZERS = [
    (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.5, "dampening": 0.3}),
    (torch.optim.Adam, {"lr": 0.05}),
    (torch.optim.Adam, {"lr": 0.05, "amsgrad": True, "weight_decay": 0.01}),
    (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}),
    (torch.optim.Adamax, {"lr": 0.05}),
    (torch.optim.NAdam, {"lr": 0.05}),
    (torch.optim.RAdam, {"lr": 0.05}),
    (torch.optim.Adagrad, {"lr": 0.1, "initial_accumulator_value": 0.1}),
    (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5, "centered": True}),
    (torch.optim.Adadelta, {"lr": 1.0}),
]
IDS = [f"{c.__name__}-{i}" for i, (c, _) in enumerate(OPTIMIZERS)]
TOL = {"rtol": 2e-5, "atol": 2e-6}


@pytest.mark.parametrize("mode", ["lazy", "exact"])
@pytest.mark.parametrize(("cls", "kw"), OPTIMIZERS, ids=IDS)
@settings(max_examples=8)
@given(steps=batches())
def test_modes_equal_their_dense_reference(mode, cls, kw, steps):
    """lazy == a dense table stepped on the touched rows only; exact == dense training."""
    s, _ = run_torch(cls, kw, mode, steps)
    reference = dense_torch(cls, kw, steps, touched_only=mode == "lazy")
    np.testing.assert_allclose(s.table, reference, **TOL)


@given(steps=batches(max_steps=8))
def test_lazy_adam_equals_sparse_adam(steps):
    # SparseAdam adds eps to sqrt(v), Adam to sqrt(v_hat): a tiny eps makes that moot.
    s, _ = run_torch(torch.optim.Adam, {"lr": 0.05, "eps": 1e-12}, "lazy", steps)
    emb = torch.nn.Embedding(ROWS, 3, sparse=True)
    emb.weight.data = torch.from_numpy(store().table.copy())
    opt = torch.optim.SparseAdam(emb.parameters(), lr=0.05, eps=1e-12)
    from tests.embeddings.runs import coef

    for k, ids in enumerate(steps):
        opt.zero_grad()
        e = emb(torch.from_numpy(ids))
        ((e * torch.from_numpy(coef(k, len(ids)))).sum() + 0.5 * (e**2).sum()).backward()
        opt.step()
    np.testing.assert_allclose(s.table, emb.weight.detach().numpy(), **TOL)


@given(steps=batches(), cls_kw=st.sampled_from(OPTIMIZERS))
@settings(max_examples=20)
def test_untouched_rows_are_bit_identical_in_lazy_mode(steps, cls_kw):
    s, _ = run_torch(*cls_kw, "lazy", steps)
    untouched = np.setdiff1d(np.arange(ROWS), np.concatenate(steps))
    np.testing.assert_array_equal(s.table[untouched], store().table[untouched])


@given(steps=batches(), cls_kw=st.sampled_from(OPTIMIZERS), mode=st.sampled_from(["lazy", "exact"]))
@settings(max_examples=20)
def test_prefetch_changes_nothing(steps, cls_kw, mode):
    a, _ = run_torch(*cls_kw, mode, steps)
    b, _ = run_torch(*cls_kw, mode, steps, prefetch=True)
    np.testing.assert_array_equal(a.table, b.table)
    for name in a.state:
        np.testing.assert_array_equal(a.state[name], b.state[name])


def test_no_update_is_lost_on_repeated_ids():
    s = dualtrain.EmbeddingStore(10, 2, init="zeros")
    rows = attach(s, torch.optim.SGD, lr=1.0)
    a, b = rows.fetch(np.array([5, 5, 5]), np.array([[5], [2]]))
    (a.sum() + b.sum()).backward()
    rows.step()
    rows.flush()
    np.testing.assert_array_equal(s.table[5], [-4.0, -4.0])
    np.testing.assert_array_equal(s.table[2], [-1.0, -1.0])


def test_fetch_shape_and_gradient_flow():
    rows = attach(store(), torch.optim.Adam, lr=0.1)
    e = rows.fetch(np.zeros((2, 5), np.int32))
    assert e.shape == (2, 5, 3) and e.requires_grad


@pytest.mark.parametrize("bad", [torch.optim.LBFGS, torch.optim.Adafactor, torch.nn.Linear, "Adam"])
def test_optimizers_without_a_row_wise_form_are_refused(bad):
    with pytest.raises(ArgumentError, match="row-wise"):
        attach(store(), bad, lr=0.1)


def _snapshot(s):
    return s.table.copy(), {k: v.copy() for k, v in s.state.items()}


def test_errors_write_nothing_back():
    s = store()
    rows = attach(s, torch.optim.Adam, lr=0.1)
    with pytest.raises(ArgumentError, match="fetch"):
        rows.step()
    with pytest.raises(ArgumentError, match=f"row id {ROWS}"):
        rows.fetch(np.array([0, ROWS]))
    with pytest.raises(DtypeError):
        rows.fetch(np.array([0.5]))
    table, state = _snapshot(s)
    rows.fetch(np.array([1, 2]))
    with pytest.raises(ArgumentError, match="backward"):
        rows.step()
    rows.fetch(np.array([1, 2]))
    rows.param.grad = torch.full((2, 3), float("nan"))
    rows.optimizer.param_groups[0]["lr"] = "fast"  # torch's own step raises on this
    with pytest.raises(TypeError):
        rows.step()
    rows.optimizer.param_groups[0]["lr"] = 0.1
    rows.flush()
    np.testing.assert_array_equal(s.table, table)
    for k in state:
        np.testing.assert_array_equal(s.state[k], state[k])
    with pytest.raises(ArgumentError, match="fetch"):
        rows.step()  # the failed batch was dropped


def test_a_store_has_one_attachment_at_a_time():
    s = store()
    rows = attach(s, torch.optim.SGD, lr=0.1)
    with pytest.raises(ArgumentError, match="already attached"):
        attach(s, torch.optim.Adam, lr=0.1)
    rows.detach()
    attach(s, torch.optim.Adam, lr=0.1)
    assert sorted(s.state) == ["exp_avg", "exp_avg_sq"]


def test_an_lr_scheduler_drives_the_real_optimizer():
    rows = attach(store(), torch.optim.SGD, lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(rows.optimizer, step_size=1, gamma=0.5)
    for _ in range(3):
        rows.fetch(np.array([0])).sum().backward()
        rows.step()
        sched.step()
    assert rows.hyper["lr"] == 0.125 and rows.steps == 3


@pytest.mark.gpu
def test_pinned_store_trains_on_cuda_like_on_the_cpu():
    steps = [np.array([1, 1, 5]), np.array([5, 2])]
    on_cpu, _ = run_torch(torch.optim.Adam, {"lr": 0.1}, "exact", steps)
    on_gpu, rows = run_torch(torch.optim.Adam, {"lr": 0.1}, "exact", steps, pinned=True)
    assert on_gpu.pinned and rows.device.type == "cuda" and on_gpu.memory().pinned
    np.testing.assert_allclose(on_gpu.table, on_cpu.table, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.SparseAdam])
def test_lazy_adam_and_sparse_adam_place_eps_as_documented(cls):
    """Step 1 at the defaults: Adam lr*g/(|g| + eps), SparseAdam lr*g/(|g| + eps/sqrt(1-b2)).

    docs/embeddings.md states the difference this way; gradients near eps show it most.
    """
    g = np.array([1.0, 1e-4, 1e-6, -1e-7])
    s = dualtrain.EmbeddingStore(4, 1, dtype="float64", init="zeros")
    rows = attach(s, cls, "lazy", lr=1e-3)
    (rows.fetch(np.arange(4))[:, 0] * torch.from_numpy(g)).sum().backward()
    rows.step()
    eps = 1e-8 if cls is torch.optim.Adam else 1e-8 / np.sqrt(1 - 0.999)
    np.testing.assert_allclose(s.table[:, 0], -1e-3 * g / (np.abs(g) + eps), rtol=1e-12)


@pytest.mark.parametrize("mode", ["lazy", "exact"])
@pytest.mark.parametrize(("cls", "kw"), OPTIMIZERS, ids=IDS)
def test_every_optimizer_trains_a_shard_as_one_process(mode, cls, kw):
    """Sharded over 2 thread ranks == one process on the union batch with the summed loss."""
    from tests.embeddings.ranks import shard_against_one

    got, single = shard_against_one("torch", lambda s: attach(s, cls, mode=mode, **kw))
    np.testing.assert_allclose(got["weight"], single.table, **TOL)
    for slot, table in single.state.items():
        np.testing.assert_allclose(got[slot], table, **TOL, err_msg=slot)
