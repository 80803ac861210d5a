"""The SpeedTorch migration shim: SpeedTorch's calls, the store's (correct) results."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from dualtrain.errors import ArgumentError
from dualtrain_torch.compat.speedtorch import (
    DataGadget,
    ModelFactory,
    OptimizerFactory,
    PytorchModelFactory,
)
from tests.embeddings.runs import DIM, ROWS, coef, run_torch, store


class SkipGram(torch.nn.Module):
    def __init__(self, rows: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(rows, DIM)

    def forward(self, pos, neg, c_pos, c_neg):
        p, n = self.emb(pos), self.emb(neg)
        return (p * c_pos).sum() + (n * c_neg).sum() + 0.5 * ((p**2).sum() + (n**2).sum())


@settings(max_examples=15)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.integers(0, ROWS - 1), min_size=2, max_size=2).map(np.array),
            st.lists(st.integers(0, ROWS - 1), min_size=4, max_size=4).map(np.array),
        ),
        min_size=1,
        max_size=5,
    ),
    cls_kw=st.sampled_from(
        [(torch.optim.Adam, {"lr": 0.05}), (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})]
    ),
)
def test_speedtorch_flow_equals_the_store_in_lazy_mode(steps, cls_kw):
    cls, kw = cls_kw
    model = SkipGram(6)
    opt = cls(model.parameters(), **kw)
    factory = ModelFactory(model.emb, ROWS, DIM)
    factory.store.table[...] = store().table
    opt_factory = OptimizerFactory(opt, ROWS, DIM, model, "emb")
    pos_local, neg_local = factory.variableTransformer(2, 1, 2)
    for k, (pos, neg) in enumerate(steps):
        pos, neg = pos.reshape(2, 1), neg.reshape(2, 2)
        factory.beforeForwardPass(pos, neg)
        opt_factory.beforeForwardPass(pos, neg)
        c = torch.from_numpy(coef(k, 6))
        opt.zero_grad()
        model(pos_local, neg_local, c[:2].view(2, 1, DIM), c[2:].view(2, 2, DIM)).backward()
        opt.step()
        factory.afterOptimizerStep(pos, neg)
        opt_factory.afterOptimizerStep(pos, neg)
    ids = [np.concatenate([p, n]) for p, n in steps]
    reference, _ = run_torch(cls, kw, "lazy", ids)
    np.testing.assert_allclose(factory.getNumpyVersion(), reference.table, rtol=2e-5, atol=2e-6)
    first = sorted(reference.state)[0]
    np.testing.assert_allclose(
        opt_factory.getNumpyVersion(first), reference.state[first], rtol=2e-5, atol=2e-6
    )


def test_initializers_and_save_load(tmp_path):
    factory = PytorchModelFactory(torch.nn.Embedding(4, 5), 1000, 5, deviceType="cpu")
    factory.uniformDistributionInit(-0.5, 0.5)
    table = factory.getNumpyVersion()
    assert table.min() >= -0.5 and table.max() <= 0.5 and table.std() > 0.2
    factory.normalDistributionInit(2.0, 0.1)
    assert abs(factory.getNumpyVersion().mean() - 2.0) < 0.01
    factory.customInit(torch.nn.init.constant_, 3.0)
    assert (factory.getNumpyVersion() == 3.0).all()
    factory.saveCupy(str(tmp_path / "table"))
    factory.zerosInit()
    factory.loadCupy(str(tmp_path / "table.npy"))
    assert (factory.getNumpyVersion() == 3.0).all()
    assert not list(tmp_path.glob(".*tmp"))


def test_data_gadget_round_trip_with_repeated_ids(tmp_path):
    np.save(tmp_path / "d.npy", np.arange(20, dtype=np.float32).reshape(10, 2))
    gadget = DataGadget(str(tmp_path / "d.npy"))
    with pytest.raises(ArgumentError, match="gadgetInit"):
        gadget.getData(np.array([0]))
    gadget.gadgetInit()
    got = gadget.getData(np.array([3, 3, 1]))
    np.testing.assert_array_equal(got.numpy(), [[6, 7], [6, 7], [2, 3]])
    gadget.insertData(torch.tensor([[0.0, 0.0], [9.0, 9.0]]), np.array([4, 4]))
    np.testing.assert_array_equal(gadget.getNumpyVersion()[4], [9.0, 9.0])
    with pytest.raises(ArgumentError, match="row id 10"):
        gadget.getData(np.array([10]))


def test_bad_arguments():
    model = SkipGram(4)
    with pytest.raises(ArgumentError, match="model_variable"):
        ModelFactory(torch.nn.ReLU(), 10, DIM)
    with pytest.raises(ArgumentError, match="variable_name"):
        OptimizerFactory(torch.optim.Adam(model.parameters()), 10, DIM, model, "nope")
    factory = ModelFactory(model.emb, 10, DIM)
    factory.beforeForwardPass(np.array([1, 2]))
    with pytest.raises(ArgumentError, match="other ids"):
        factory.afterOptimizerStep(np.array([1, 3]))
