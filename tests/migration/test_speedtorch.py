"""SpeedTorch's README, migrated: the shim == dualtrain's `attach` == plain torch.

Same seeds, same batches (ids with repeats) -> the same tables and optimizer state, through
`dualtrain_torch.compat.speedtorch` (SpeedTorch's calls), `dualtrain_torch.attach` (lazy) and
plain torch on a dense table stepped on the touched rows only (the lazy reference). SparseAdam
matches ``torch.optim.SparseAdam`` on a sparse ``nn.Embedding``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import dualtrain
from dualtrain.errors import ArgumentError
from dualtrain_torch import attach
from dualtrain_torch.compat import speedtorch as SpeedTorch  # noqa: N812 (the seed's name)
from tests.embeddings.runs import DIM, ROWS, coef, dense_torch, run_torch, store

OPTIMIZERS = [
    (torch.optim.Adagrad, {"lr": 0.1}),
    (torch.optim.Adam, {"lr": 0.05}),
    (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}),
    (torch.optim.Adamax, {"lr": 0.05}),
    (torch.optim.Adadelta, {"lr": 1.0}),
    (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5, "centered": True}),
    (torch.optim.ASGD, {"lr": 0.05, "t0": 1.0, "weight_decay": 0.01}),
    (torch.optim.Rprop, {"lr": 0.05}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
]
TOL = {"rtol": 1e-5, "atol": 1e-6}

ids_2d = st.lists(st.integers(0, ROWS - 1), min_size=4, max_size=4).map(
    lambda v: np.array(v).reshape(2, 2)
)
batches = st.lists(ids_2d, min_size=1, max_size=4)


class SkipGram(torch.nn.Module):
    """A batch-sized embedding, as in SpeedTorch's notebooks."""

    def __init__(self, rows: int, sparse: bool = False) -> None:
        super().__init__()
        self.u_embeddings = torch.nn.Embedding(rows, DIM, sparse=sparse)

    def forward(self, local, c):
        e = self.u_embeddings(local)
        return (e * c).sum() + 0.5 * (e**2).sum()


def run_shim(cls, kw, steps, sparse=False):
    model = SkipGram(4, sparse)
    opt = cls(model.parameters(), **kw)
    switcher = SpeedTorch.PytorchModelFactory(model.u_embeddings, ROWS, DIM, deviceType="cpu")
    switcher.store.table[...] = store().table
    opt_switcher = SpeedTorch.PytorchOptimizerFactory(
        opt, ROWS, DIM, model, "u_embeddings", deviceType="cpu"
    )
    opt_switcher.optInit()
    local = switcher.variableTransformer(2, 2)  # NumPy, as SpeedTorch's
    for k, ids in enumerate(steps):
        switcher.beforeForwardPass(ids)
        opt_switcher.beforeForwardPass(ids)
        opt.zero_grad()
        c = torch.from_numpy(coef(k, 4)).view(2, 2, DIM)
        model(torch.from_numpy(local), c).backward()
        opt.step()
        switcher.afterOptimizerStep(ids)
        opt_switcher.afterOptimizerStep(ids)
    return switcher, opt_switcher


@settings(max_examples=25, deadline=None)
@given(steps=batches, cls_kw=st.sampled_from(OPTIMIZERS))
def test_shim_equals_attach_equals_plain_torch(steps, cls_kw):
    cls, kw = cls_kw
    flat = [ids.ravel() for ids in steps]
    switcher, opt_switcher = run_shim(cls, kw, steps)
    # attach's own default is the fused kernel; the shim's optimizer is the plain one
    attached, _ = run_torch(cls, {**kw, "foreach": False}, "lazy", flat)
    reference = dense_torch(cls, kw, flat, touched_only=True)
    np.testing.assert_allclose(switcher.getNumpyVersion(), attached.table, **TOL)
    np.testing.assert_allclose(switcher.getNumpyVersion(), reference, **TOL)
    assert sorted(opt_switcher.tables) == sorted(attached.state)
    for slot, table in opt_switcher.tables.items():
        np.testing.assert_allclose(table, attached.state[slot], **TOL)


@settings(max_examples=20, deadline=None)
@given(steps=batches)
def test_sparse_adam_matches_torch_sparse_adam_exactly(steps):
    kw = {"lr": 0.05, "eps": 1e-3}  # an eps that matters: SparseAdam adds it to sqrt(v)
    flat = [ids.ravel() for ids in steps]
    switcher, opt_switcher = run_shim(torch.optim.SparseAdam, kw, steps, sparse=True)
    attached, _ = run_torch(torch.optim.SparseAdam, kw, "lazy", flat)
    emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
    emb.weight.data = torch.from_numpy(store().table.copy())
    opt = torch.optim.SparseAdam(emb.parameters(), **kw)
    for k, ids in enumerate(flat):
        opt.zero_grad()
        e = emb(torch.from_numpy(ids))
        ((e * torch.from_numpy(coef(k, len(ids)))).sum() + 0.5 * (e**2).sum()).backward()
        opt.step()
    want = emb.weight.detach().numpy()
    np.testing.assert_allclose(attached.table, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(switcher.getNumpyVersion(), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        opt_switcher.tables["exp_avg_sq"], opt.state[emb.weight]["exp_avg_sq"], rtol=1e-6
    )


def test_sparse_adam_is_lazy_only_in_attach():
    with pytest.raises(ArgumentError, match=r"mode.*SparseAdam"):
        attach(store(), torch.optim.SparseAdam, mode="exact", lr=0.1)


@pytest.mark.parametrize("cls", [torch.optim.LBFGS, torch.optim.Adafactor, torch.optim.Muon])
def test_optimizers_without_a_row_wise_form_are_refused_naming_why(cls):
    model = SkipGram(4)
    opt = cls([model.u_embeddings.weight], lr=0.1)
    with pytest.raises(ArgumentError, match=f"{cls.__name__} has no row-wise form: .*row"):
        SpeedTorch.OptimizerFactory(opt, ROWS, DIM, model, "u_embeddings")
    with pytest.raises(ArgumentError, match=f"{cls.__name__} has no row-wise form"):
        attach(store(), cls, lr=0.1)


# ---- init methods ------------------------------------------------------------------------

INITS = st.sampled_from(
    [
        ("uniformDistributionInit", (-0.5, 0.5), torch.nn.init.uniform_),
        ("normalDistributionInit", (0.0, 0.3), torch.nn.init.normal_),
    ]
)


@settings(max_examples=20, deadline=None)
@given(init=INITS, seed=st.integers(0, 2**32), rows=st.integers(1, 300))
def test_init_without_seed_gives_speedtorchs_numbers(init, seed, rows):
    """seed=None: torch's global generator on the whole table, as SpeedTorch's CPU factory."""
    name, args, torch_init = init
    factory = SpeedTorch.PytorchModelFactory(torch.nn.Embedding(2, DIM), rows, DIM, "float32")
    torch.manual_seed(seed)
    getattr(factory, name)(*args)
    torch.manual_seed(seed)
    want = torch_init(torch.empty(rows, DIM), *args)
    np.testing.assert_array_equal(factory.getNumpyVersion(), want.numpy())


@settings(max_examples=20, deadline=None)
@given(init=INITS, seed=st.integers(0, 2**64 - 1), rows=st.integers(1, 5000))
def test_init_with_a_seed_equals_the_store_attach_trains(init, seed, rows):
    name, (a, b), _ = init
    factory = SpeedTorch.ModelFactory(torch.nn.Embedding(2, DIM), rows, DIM)
    getattr(factory, name)(a, b, seed=seed)
    if name == "normalDistributionInit":
        want = dualtrain.EmbeddingStore(rows, DIM, init="normal", std=b, seed=seed)
    else:
        draw = lambda r, rng: rng.uniform(a, b, (len(r), DIM))  # noqa: E731
        want = dualtrain.EmbeddingStore(rows, DIM, init=draw, seed=seed)
    np.testing.assert_array_equal(factory.getNumpyVersion(), want.table)


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (torch.nn.init.xavier_uniform_, ()),
        (torch.nn.init.kaiming_normal_, ()),
        (torch.nn.init.constant_, (3.0,)),
        (torch.nn.init.trunc_normal_, (0.0, 0.1)),
    ],
)
def test_custom_init_fills_the_whole_table_as_torch_does(fn, args):
    """Fan-in and fan-out are the table's (the old shim filled 4,096-row blocks)."""
    factory = SpeedTorch.PytorchModelFactory(torch.nn.Embedding(2, 8), 5000, 8)
    torch.manual_seed(3)
    factory.customInit(fn, *args)
    torch.manual_seed(3)
    want = fn(torch.empty(5000, 8), *args)
    np.testing.assert_array_equal(factory.getNumpyVersion(), want.numpy())


def test_zeros_init_and_variable_transformer_as_speedtorch():
    factory = SpeedTorch.ModelFactory(torch.nn.Embedding(2, DIM), 10, DIM)
    factory.normalDistributionInit(0.0, 1.0)
    factory.zerosInit()
    assert not factory.getNumpyVersion().any()
    pos, neg = factory.variableTransformer(2, 3, 2)
    assert isinstance(pos, np.ndarray) and isinstance(neg, np.ndarray)
    np.testing.assert_array_equal(pos, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(neg, np.arange(6, 10).reshape(2, 2))
    np.testing.assert_array_equal(factory.variableTransformer(2, 1), [[0], [1]])


def test_repeated_ids_lose_no_update_whatever_the_local_ids_are():
    """Local ids converted once (a copy, as the notebooks did) still see the right rows."""
    model = SkipGram(3)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    switcher = SpeedTorch.ModelFactory(model.u_embeddings, 10, DIM)
    local = torch.tensor(switcher.variableTransformer(1, 3)).clone()
    ids = np.array([[5, 5, 2]])
    switcher.beforeForwardPass(ids)
    model.u_embeddings(local).sum().backward()
    opt.step()
    switcher.afterOptimizerStep(ids)
    np.testing.assert_array_equal(switcher.getNumpyVersion()[5], [-2.0] * DIM)
    np.testing.assert_array_equal(switcher.getNumpyVersion()[2], [-1.0] * DIM)


def test_asgd_averages_as_torch_does_when_one_row_steps_again():
    # attach stepped its twin of ASGD's globals once per global: mu ran ahead and `ax`
    # (the average of the iterates) went wrong from the third step on.
    kw = {"lr": 0.05, "t0": 1.0, "weight_decay": 0.01}
    flat = [np.zeros(4, dtype=np.int64)] * 4
    attached, _ = run_torch(torch.optim.ASGD, {**kw, "foreach": False}, "lazy", flat)
    w = torch.nn.Parameter(torch.from_numpy(store().table.copy()))
    opt = torch.optim.ASGD([w], **kw, foreach=False)
    for k, ids in enumerate(flat):
        opt.zero_grad()
        e = w[torch.from_numpy(ids)]
        ((e * torch.from_numpy(coef(k, 4))).sum() + 0.5 * (e**2).sum()).backward()
        opt.step()
    np.testing.assert_allclose(attached.state["ax"][0], opt.state[w]["ax"][0].numpy(), **TOL)
