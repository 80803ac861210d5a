"""The SpeedTorch migration shim: SpeedTorch's calls, the store's (correct) results."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from dualtrain import atomic
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
    pos_np, neg_np = factory.variableTransformer(2, 1, 2)  # NumPy, as SpeedTorch's
    pos_local, neg_local = torch.from_numpy(pos_np), torch.from_numpy(neg_np)
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


# ---- files: SpeedTorch's formats, written atomically, checked before loading ------------


def _factory(rows=50, dim=DIM):
    factory = ModelFactory(torch.nn.Embedding(4, dim), rows, dim, deviceType="cpu")
    factory.normalDistributionInit(0.0, 1.0)
    return factory


def test_save_torch_then_load_torch_round_trips_under_the_same_name(tmp_path):
    factory = _factory()
    saved = factory.getNumpyVersion().copy()
    factory.saveTorch(str(tmp_path / "u.pt"))
    assert [p.name for p in tmp_path.iterdir()] == ["u.pt"]  # the exact name, nothing else
    factory.zerosInit()
    factory.loadTorch(str(tmp_path / "u.pt"))
    np.testing.assert_array_equal(factory.getNumpyVersion(), saved)
    # The file is what SpeedTorch's saveTorch writes: one tensor, readable without pickle.
    loaded = torch.load(tmp_path / "u.pt", weights_only=True)
    assert isinstance(loaded, torch.Tensor)
    np.testing.assert_array_equal(loaded.numpy(), saved)


def test_load_torch_reads_a_file_written_by_speedtorch(tmp_path):
    # SpeedTorch's saveTorch is torch.save(self.pytorchGPUVar, saveFileName).
    table = torch.randn(30, DIM, dtype=torch.float32)
    torch.save(table, tmp_path / "speedtorch.pt")
    factory = _factory(rows=30)
    factory.loadTorch(str(tmp_path / "speedtorch.pt"))
    np.testing.assert_array_equal(factory.getNumpyVersion(), table.numpy())


class _NotATensor:
    pass


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (torch.zeros(7, DIM), rf"shape \(50, {DIM}\).*\(7, {DIM}\)"),
        (torch.zeros(50, DIM, dtype=torch.float64), "float32 table.*float64"),
        ({"w": torch.zeros(50, DIM)}, "holding one tensor"),
        (_NotATensor(), "weights_only=True"),
    ],
)
def test_load_torch_refuses_other_content_and_leaves_the_table(tmp_path, content, match):
    factory = _factory()
    before = factory.getNumpyVersion().copy()
    torch.save(content, tmp_path / "bad.pt")
    with pytest.raises(ArgumentError, match=f"loadFileName.*{match}"):
        factory.loadTorch(str(tmp_path / "bad.pt"))
    np.testing.assert_array_equal(factory.getNumpyVersion(), before)


def test_save_cupy_writes_the_npy_file_cupy_save_writes(tmp_path):
    factory = _factory()
    factory.saveCupy(str(tmp_path / "table"))  # cupy.save, like np.save, appends .npy
    np.testing.assert_array_equal(np.load(tmp_path / "table.npy"), factory.getNumpyVersion())
    saved = factory.getNumpyVersion().copy()
    factory.zerosInit()
    factory.loadCupy(str(tmp_path / "table"))  # the name given to saveCupy finds it too
    np.testing.assert_array_equal(factory.getNumpyVersion(), saved)
    np.save(tmp_path / "small.npy", np.zeros((3, DIM), np.float32))
    with pytest.raises(ArgumentError, match="loadFileName"):
        factory.loadCupy(str(tmp_path / "small.npy"))
    np.testing.assert_array_equal(factory.getNumpyVersion(), saved)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.npy", "table.npy"]


def test_data_gadget_save_cupy_and_load_cupy(tmp_path):
    np.save(tmp_path / "d.npy", np.arange(20, dtype=np.float32).reshape(10, 2))
    gadget = DataGadget(str(tmp_path / "d.npy"))
    gadget.gadgetInit()
    gadget.insertData(torch.tensor([[7.0, 7.0]]), np.array([0]))
    gadget.saveCupy(str(tmp_path / "out.npy"))
    other = DataGadget(str(tmp_path / "d.npy"))
    other.loadCupy(str(tmp_path / "out.npy"))  # "Load new tensor from .npy file"
    np.testing.assert_array_equal(other.getData(np.array([0])).numpy(), [[7.0, 7.0]])
    np.save(tmp_path / "flat.npy", np.zeros(3))
    with pytest.raises(ArgumentError, match="2-D"):
        other.loadCupy(str(tmp_path / "flat.npy"))


def test_optimizer_factory_save_torch_round_trips_its_state_tables(tmp_path):
    model = SkipGram(4)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    factory = OptimizerFactory(opt, 20, DIM, model, "emb")
    for k, table in enumerate(factory.tables.values()):
        table[...] = np.arange(table.size, dtype=table.dtype).reshape(table.shape) + k
    saved = {slot: t.copy() for slot, t in factory.tables.items()}
    factory.saveTorch(str(tmp_path / "adam.pt"))
    factory.optInit()
    factory.loadTorch(str(tmp_path / "adam.pt"))
    for slot, table in factory.tables.items():
        np.testing.assert_array_equal(table, saved[slot])
    loaded = torch.load(tmp_path / "adam.pt", weights_only=True)
    assert isinstance(loaded, list) and len(loaded) == len(saved)
    torch.save(loaded[:1], tmp_path / "short.pt")
    with pytest.raises(ArgumentError, match="a list of 2 tensors"):
        factory.loadTorch(str(tmp_path / "short.pt"))


def test_the_shims_saves_go_through_the_one_atomic_writer(tmp_path):
    """A save sweeps a dead writer's temporary file and gets the umask's permissions."""
    from tests.checkpoint.test_files import dead_pid, temp_name

    stale = tmp_path / temp_name("u.pt", dead_pid())
    stale.write_bytes(b"half a file")
    factory = _factory()
    factory.saveTorch(str(tmp_path / "u.pt"))
    factory.saveCupy(str(tmp_path / "table"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.npy", "u.pt"]
    mode = 0o666 & ~atomic.umask()
    assert {(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()} == {mode}
