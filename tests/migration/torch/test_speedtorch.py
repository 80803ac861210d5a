"""SpeedTorch's README, migrated: the shim == dualtrain's `attach` == plain torch.

Same seeds, same batches (ids with repeats) -> the same tables and optimizer state, through
`dualtrain_torch.compat.speedtorch` (SpeedTorch's calls), `dualtrain_torch.attach` (lazy) and
plain torch on a dense table stepped on the touched rows only (the lazy reference). SparseAdam
matches ``torch.optim.SparseAdam`` on a sparse ``nn.Embedding``.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import dualtrain
from dualtrain.errors import ArgumentError
from dualtrain_torch import attach
from dualtrain_torch.compat import speedtorch as SpeedTorch  # noqa: N812 (the seed's name)
from dualtrain_torch.compat.nebulgym import RetiredError
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


# ---- SpeedTorch's classes, each with SpeedTorch's arguments ------------------------------

E = inspect.Parameter.empty
MODEL = [("model_variable", E), ("total_classes", E), ("embed_dimension", E)]
OPTIM = [
    ("given_optimizer", E),
    ("total_classes", E),
    ("embed_dimension", E),
    ("model", E),
    ("variable_name", E),
]
# SpeedTorch's source (CUPYLive, CPUCupyPinned, GPUTorch, CPUTorchPinned, GenTorch): every
# class's positional arguments, in order, with their defaults.
SPEEDTORCH = {
    "ModelFactory": [*MODEL, ("datatype", "float32"), ("CPUPinn", False)],
    "OptimizerFactory": [*OPTIM, ("dtype", "float32"), ("CPUPinn", False)],
    "COM": [("total_classes", E), ("datatype", "uint32"), ("CPUPinn", False)],
    "DataGadget": [("fileName", E), ("CPUPinn", False)],
    "ModelFactoryMM": [
        *MODEL,
        ("diskname", "variable"),
        ("datatype", "float32"),
        ("CPUPinn", False),
    ],
    "OptimizerFactoryMM": [*OPTIM, ("dtype", "float32"), ("CPUPinn", False)],
    "COMMM": [
        ("total_classes", E),
        ("diskname", "COM"),
        ("datatype", "uint32"),
        ("CPUPinn", False),
    ],
    "DataGadgetMM": [("fileName", E), ("CPUPinn", False)],
    "GPUPytorchModelFactory": [*MODEL, ("datatype", torch.float)],
    "GPUPytorchOptimizerFactory": [*OPTIM, ("dtype", torch.float)],
    "GPUPytorchCOM": [("total_classes", E), ("datatype", torch.int32)],
    "CPUPytorchModelFactory": [*MODEL, ("datatype", torch.float)],
    "CPUPytorchOptimizerFactory": [*OPTIM, ("dtype", torch.float)],
    "CPUPytorchCOM": [("total_classes", E), ("datatype", torch.int32)],
    "PytorchModelFactory": [
        *MODEL,
        ("datatype", torch.float),
        ("deviceType", "cuda"),
        ("pinType", False),
    ],
    "PytorchOptimizerFactory": [
        *OPTIM,
        ("dtype", torch.float),
        ("deviceType", "cuda"),
        ("pinType", False),
    ],
    "PytorchCOM": [("total_classes", E), ("datatype", torch.int32)],
}
# Their methods' arguments (SpeedTorch's README and source).
METHODS = {
    "zerosInit": [],
    "uniformDistributionInit": [("low", E), ("high", E)],
    "normalDistributionInit": [("mean", E), ("stdDev", E)],
    "customInit": [("initFunction", E), ("args", E)],
    "variableTransformer": [("batchSize", E), ("posPerBatch", E), ("negPerBatch", None)],
    "beforeForwardPass": [("retrievedPosIndexes", E), ("retrievedNegIndexes", None)],
    "afterOptimizerStep": [("retrievedPosIndexes", E), ("retrievedNegIndexes", None)],
    "saveCupy": [("saveFileName", E)],
    "loadCupy": [("loadFileName", E)],
    "saveTorch": [("saveFileName", E)],
    "loadTorch": [("loadFileName", E)],
    "getNumpyVersion": [],
    "optInit": [],
    "gadgetInit": [],
    "getData": [("indexes", E)],
    "insertData": [("dataObject", E), ("indexes", E)],
}


def positional(fn: Any) -> list[tuple[str, object]]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    return [
        (p.name, p.default) for p in inspect.signature(fn).parameters.values() if p.kind in kinds
    ]


@pytest.mark.parametrize("name", sorted(SPEEDTORCH))
def test_every_class_takes_speedtorchs_arguments_in_speedtorchs_order(name):
    cls = getattr(SpeedTorch, name)
    # The one default that differs, as documented: None is "cuda" when present, else "cpu".
    want = [(n, None if n == "deviceType" else d) for n, d in SPEEDTORCH[name]]
    assert positional(cls) == want
    others = [p for p in inspect.signature(cls).parameters.values() if p.name not in dict(want)]
    assert all(p.kind == p.KEYWORD_ONLY for p in others)  # dualtrain's additions
    for method, args in METHODS.items():
        if name == "DataGadgetMM" and method == "getData":
            args = METHODS["beforeForwardPass"]  # the MM gadget's getData took both id arrays
        if "OptimizerFactory" in name and method == "getNumpyVersion":
            args = [("slot", None)]  # dualtrain's optional slot; SpeedTorch's raised here
        if hasattr(cls, method):
            assert positional(getattr(cls, method))[1:] == args, method
    if "COM" in name:
        comInit = positional(cls.comInit)[1:]  # noqa: N806
        assert comInit == ([] if "Pytorch" in name else [("CPUPinn", False)])


def test_every_name_of_speedtorchs_package_resolves():
    assert sorted(SpeedTorch.__all__) == sorted(SPEEDTORCH)
    for name in ("PMemory", "my_pinned_allocator", "PMemoryMM", "my_pinned_allocatorMM"):
        with pytest.raises(RetiredError, match=rf"{name} is not provided: .*pinned"):
            exec(f"from dualtrain_torch.compat.speedtorch import {name}", {})
    with pytest.raises(AttributeError):
        SpeedTorch.NoSuchClass  # noqa: B018


def test_pytorch_model_factory_takes_its_device_fifth():
    """SpeedTorch's 5th argument is deviceType here; it was CPUPinn (the device was lost)."""
    var = torch.nn.Embedding(2, 4)
    factory = SpeedTorch.PytorchModelFactory(var, 10, 4, "float32", "cpu", False)
    assert factory.device == torch.device("cpu") and factory.pinType is False
    assert factory.store.dtype == "float32" and factory.deviceType == "cpu"
    opt = torch.optim.Adam([var.weight])
    model = torch.nn.ModuleDict({"e": var})
    o = SpeedTorch.PytorchOptimizerFactory(opt, 10, 4, model, "e", torch.float64, "cpu", True)
    assert o.deviceType == "cpu" and o.pinType is True and o.store.dtype == "float64"


FACTORIES = st.sampled_from(
    [
        ("ModelFactory", ["float32", False]),
        ("PytorchModelFactory", [torch.float64, "cpu", True]),
        ("GPUPytorchModelFactory", [torch.float32]),
        ("CPUPytorchModelFactory", ["float64"]),
        ("ModelFactoryMM", ["u", "float32", True]),
    ]
)


@settings(max_examples=12, deadline=None)
@given(factory=FACTORIES, rows=st.integers(4, 40), dim=st.integers(1, 6), seed=st.integers(0, 99))
def test_a_positional_call_equals_the_keyword_call(factory, rows, dim, seed, tmp_path_factory):
    name, extra = factory
    cls = getattr(SpeedTorch, name)
    names = [n for n, _ in SPEEDTORCH[name]][3:]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("mm"))
        built = []
        for by_position in (True, False):
            var = torch.nn.Embedding(3, dim)
            if by_position:
                f = cls(var, rows, dim, *extra)
            else:
                f = cls(model_variable=var, total_classes=rows, embed_dimension=dim,
                        **dict(zip(names, extra, strict=True)))  # fmt: skip
            torch.manual_seed(seed)
            f.uniformDistributionInit(-1.0, 1.0)
            ids = np.array([[seed % rows, 1, seed % rows]])
            f.beforeForwardPass(ids)
            torch.optim.SGD(var.parameters(), lr=0.5).zero_grad()
            var(torch.from_numpy(f.variableTransformer(1, 3))).sum().backward()
            torch.optim.SGD(var.parameters(), lr=0.5).step()
            f.afterOptimizerStep(ids)
            built.append(f)
    a, b = built
    assert (a.store.dtype, a.device, a.total_classes, a.embed_dimension) == (
        b.store.dtype, b.device, rows, dim,
    )  # fmt: skip
    np.testing.assert_array_equal(a.getNumpyVersion(), b.getNumpyVersion())


@settings(max_examples=8, deadline=None)
@given(
    name=st.sampled_from(sorted(n for n in SPEEDTORCH if "OptimizerFactory" in n)),
    dtype=st.sampled_from(["float32", torch.float64]),
)
def test_optimizer_factories_by_position_equal_by_keyword(name, dtype):
    cls = getattr(SpeedTorch, name)
    rest = {"OptimizerFactory": [False], "OptimizerFactoryMM": [True]}
    rest["PytorchOptimizerFactory"] = ["cpu", False]
    extra = [dtype, *rest.get(name, [])]
    keywords = dict(zip([n for n, _ in SPEEDTORCH[name]][5:], extra, strict=False))
    tables = []
    for by_position in (True, False):
        model = SkipGram(4)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        if by_position:
            f = cls(opt, ROWS, DIM, model, "u_embeddings", *extra)
        else:
            f = cls(
                given_optimizer=opt,
                total_classes=ROWS,
                embed_dimension=DIM,
                model=model,
                variable_name="u_embeddings",
                **keywords,
            )
        f.optInit()
        tables.append(f.tables)
    assert sorted(tables[0]) == sorted(tables[1]) == ["exp_avg", "exp_avg_sq"]
    for slot in tables[0]:
        assert tables[0][slot].dtype == tables[1][slot].dtype
        np.testing.assert_array_equal(tables[0][slot], tables[1][slot])


# ---- SpeedTorch's README, as written (imports changed; "cuda" -> "cpu" without a GPU) -------

README_IMPORT = """
from dualtrain_torch.compat import speedtorch as SpeedTorch
from dualtrain_torch.compat.speedtorch import (
    DataGadget, ModelFactory, OptimizerFactory, PytorchModelFactory, PytorchOptimizerFactory,
)
"""
# Its code blocks, in order (the first, `!pip install SpeedTorch`, `import cupy` and
# `import SpeedTorch`, is README_IMPORT).
README_BLOCKS = [
    "ModelFactory(model_variable,  total_classes,  embed_dimension, datatype = 'float32', CPUPinn = False)",  # noqa: E501
    "uEmbed_switcher = SpeedTorch.ModelFactory( skip_gram_modelSparse.u_embeddings, total_classes=50000, embed_dimension=128)",  # noqa: E501
    "OptimizerFactory( given_optimizer,  total_classes,  embed_dimension, model, variable_name, dtype='float32' , CPUPinn = False)",  # noqa: E501
    "uAdagrad_switcher = SpeedTorch.OptimizerFactory(given_optimizer,  total_classes,  embed_dimension, model, variable_name, dtype='float32', CPUPinn = False)",  # noqa: E501
    "DataGadget( fileName, CPUPinn=False)",
    "PytorchModelFactory(model_variable,  total_classes,  embed_dimension, datatype = 'float32', deviceType = 'cuda', pinType = False)",  # noqa: E501
    "uEmbed_switcher = SpeedTorch.PytorchModelFactory( skip_gram_modelSparse.u_embeddings, total_classes=50000, embed_dimension=128)",  # noqa: E501
    "PytorchOptimizerFactory( given_optimizer,  total_classes,  embed_dimension, model, variable_name, dtype='float32', deviceType = 'cuda', pinType = False)",  # noqa: E501
    "uAdagrad_switcher = SpeedTorch.PytorchOptimizerFactory(given_optimizer,  total_classes,  embed_dimension, model, variable_name, dtype='float32')",  # noqa: E501
]


class TwoEmbeddings(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.u_embeddings = torch.nn.Embedding(8, 128)
        self.v_embeddings = torch.nn.Embedding(8, 128)


def test_readme_blocks_run_as_written_then_train(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save("data.npy", np.arange(40, dtype=np.float32).reshape(10, 4))
    model = TwoEmbeddings()
    ns = {
        "skip_gram_modelSparse": model,
        "model": model,
        "model_variable": model.u_embeddings,
        "given_optimizer": torch.optim.Adagrad(model.parameters(), lr=0.1),
        "total_classes": 50000,
        "embed_dimension": 128,
        "variable_name": "u_embeddings",
        "fileName": "data.npy",
    }
    exec(README_IMPORT, ns)
    for block in README_BLOCKS:
        if not torch.cuda.is_available():
            block = block.replace("deviceType = 'cuda'", "deviceType = 'cpu'")
        exec(block, ns)
    u, u_opt = ns["uEmbed_switcher"], ns["uAdagrad_switcher"]
    assert isinstance(u, SpeedTorch.PytorchModelFactory) and u.store.table.shape == (50000, 128)
    # The documented methods, as the README lists them.
    u.uniformDistributionInit(-0.5 / 128, 0.5 / 128)
    u_opt.optInit()
    local = u.variableTransformer(2, 2)
    ids = np.array([[7, 49999], [7, 3]])
    u.beforeForwardPass(ids)
    u_opt.beforeForwardPass(ids)
    ns["given_optimizer"].zero_grad()
    model.u_embeddings(torch.from_numpy(local).to(u.device)).square().sum().backward()
    ns["given_optimizer"].step()
    u.afterOptimizerStep(ids)
    u_opt.afterOptimizerStep(ids)
    assert u_opt.getNumpyVersion("sum")[[3, 7, 49999]].min() > 0  # each row's state moved
    u.saveTorch("u.pt")
    u.loadTorch("u.pt")
    u.saveCupy("u.npy")
    u.loadCupy("u.npy")
    u.customInit(torch.nn.init.normal_, 0.0, 0.1)
    u.normalDistributionInit(0.0, 0.1)
    u.zerosInit()
    assert not u.getNumpyVersion().any()
    gadget = ns["DataGadget"]("data.npy", CPUPinn=False)
    gadget.gadgetInit()
    gadget.insertData(gadget.getData(np.array([2, 2])) * 0, np.array([2, 2]))
    gadget.saveCupy("out.npy")
    gadget.loadCupy("out.npy")
    assert not gadget.getNumpyVersion()[2].any()


# ---- the memmap classes, COM, and SpeedTorch's getters ------------------------------------


def test_memmap_factory_keeps_its_table_in_speedtorchs_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    var, var2 = torch.nn.Embedding(3, DIM), torch.nn.Embedding(3, DIM)
    mm = SpeedTorch.ModelFactoryMM(var, 20, DIM)
    live = SpeedTorch.ModelFactory(var2, 20, DIM)
    assert mm.fileName is None
    for f in (mm, live):
        torch.manual_seed(5)
        f.normalDistributionInit(0.0, 1.0)
    assert mm.fileName == "variable0.memmap.cpy.npy"
    assert isinstance(mm.getCupyMM(), np.memmap)
    for f, v in ((mm, var), (live, var2)):
        f.beforeForwardPass(np.array([4, 4, 9]))
        v(torch.from_numpy(f.variableTransformer(1, 3))).sum().backward()
        torch.optim.SGD(v.parameters(), lr=1.0).step()
        f.afterOptimizerStep(np.array([4, 4, 9]))
    np.testing.assert_array_equal(mm.getNumpyVersion(), live.getNumpyVersion())
    np.testing.assert_array_equal(np.load("variable0.memmap.cpy.npy"), live.getNumpyVersion())
    other = SpeedTorch.ModelFactoryMM(torch.nn.Embedding(3, DIM), 5, DIM, "w")
    other.zerosInit()
    assert other.fileName == "w0.memmap.cpy.npy"
    model = SkipGram(3)
    opt = SpeedTorch.OptimizerFactoryMM(
        torch.optim.Adagrad(model.parameters()), 20, DIM, model, "u_embeddings"
    )
    opt.optInit()
    assert sorted(opt.tables) == ["sum"]


def test_memmap_gadget_reads_and_writes_its_file(tmp_path):
    path = tmp_path / "d.npy"
    np.save(path, np.arange(12, dtype=np.float32).reshape(6, 2))
    gadget = SpeedTorch.DataGadgetMM(str(path))
    gadget.gadgetInit()
    got = gadget.getData(np.array([[1], [5]]), np.array([0]))  # positives, then negatives
    np.testing.assert_array_equal(got.cpu().numpy(), [[2, 3], [10, 11], [0, 1]])
    gadget.insertData(torch.tensor([[7.0, 7.0]]), np.array([3]))
    gadget.getCupyMM().flush()
    np.testing.assert_array_equal(np.load(path)[3], [7.0, 7.0])


@pytest.mark.parametrize("name", ["COM", "COMMM", "PytorchCOM", "GPUPytorchCOM", "CPUPytorchCOM"])
def test_co_occurrence_matrices_are_allocated(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    com = getattr(SpeedTorch, name)(6)
    with pytest.raises(ArgumentError, match="comInit"):
        com.getNumpyVersion()
    com.comInit()
    matrix = com.getNumpyVersion()
    assert matrix.shape == (6, 6) and not matrix.any()
    assert matrix.dtype == (np.uint32 if "Pytorch" not in name else np.int32)
    if name == "COM":
        assert com.CUPYCom is matrix
    if name == "COMMM":
        assert com.fileName == "COM0.memmap.cpy.npy" and isinstance(com.CUPYmemmap, np.memmap)
    if name == "CPUPytorchCOM":
        assert com.pytorchCPUVar.device.type == "cpu"
    if "Pytorch" in name:
        assert com.getTorchVar() is com.pytorchGPUVar


def test_speedtorchs_getters_give_the_table():
    factory = SpeedTorch.ModelFactory(torch.nn.Embedding(2, DIM), 10, DIM)
    factory.normalDistributionInit(0.0, 1.0)
    assert factory.getCupyVar() is factory.getNumpyVersion()
    np.testing.assert_array_equal(factory.getTorchVar().numpy(), factory.getNumpyVersion())


# ---- bad input: named by SpeedTorch's argument names ------------------------------------


def _emb():
    return torch.nn.Embedding(2, DIM)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: SpeedTorch.ModelFactory(_emb(), 10, DIM, "float32", "cpu"), ArgumentError,  # type: ignore[arg-type]
         r"CPUPinn must be True or False; got CPUPinn='cpu'"),
        (lambda: SpeedTorch.PytorchModelFactory(_emb(), 10, DIM, "float32", "tpu"), ArgumentError,
         r"deviceType must be None .*got deviceType='tpu'"),
        (lambda: SpeedTorch.PytorchModelFactory(_emb(), 10, DIM, pinType="yes"), ArgumentError,  # type: ignore[arg-type]
         r"pinType must be True or False"),
        (lambda: SpeedTorch.ModelFactory(_emb(), 0, DIM), ArgumentError,
         r"total_classes must be a positive int; got total_classes=0"),
        (lambda: SpeedTorch.ModelFactory(_emb(), 10, 2.5), ArgumentError, r"embed_dimension"),  # type: ignore[arg-type]
        (lambda: SpeedTorch.ModelFactory(_emb(), 10, DIM, "int8"), ArgumentError,
         r"datatype must be a float dtype.*got datatype='int8'"),
        (lambda: SpeedTorch.GPUPytorchModelFactory(_emb(), 10, DIM, "float32", "cuda"), TypeError,  # type: ignore[call-arg]
         r"positional"),  # SpeedTorch's class takes four: a fifth is refused as there
        (lambda: SpeedTorch.ModelFactory(_emb(), 10, DIM).uniformDistributionInit(0, 1, 3),  # type: ignore[call-arg]
         TypeError, r"positional"),  # seed is keyword-only: SpeedTorch took two
        (lambda: SpeedTorch.ModelFactory(_emb(), 10, DIM).customInit(3), ArgumentError,
         r"initFunction"),
        (lambda: SpeedTorch.ModelFactoryMM(_emb(), 10, DIM, ""), ArgumentError, r"diskname"),
        (lambda: SpeedTorch.OptimizerFactory("adam", 10, DIM, SkipGram(2), "u_embeddings"),  # type: ignore[arg-type]
         ArgumentError, r"given_optimizer must be a torch.optim.Optimizer"),
        (lambda: SpeedTorch.OptimizerFactory(
            torch.optim.Adam(_emb().parameters()), 10, DIM, "model", "u"), ArgumentError,  # type: ignore[arg-type]
         r"model must be the torch.nn.Module"),
        (lambda: SpeedTorch.OptimizerFactory(
            torch.optim.Adam(SkipGram(2).parameters()), 10, DIM, SkipGram(2), "u_embeddings",
            torch.int64), ArgumentError, r"dtype must be a float dtype"),
        (lambda: SpeedTorch.COM(3, "bool"), ArgumentError, r"datatype must be an int or float"),
        (lambda: SpeedTorch.PytorchCOM(3, "int32"), ArgumentError, r"datatype must be a torch"),
        (lambda: SpeedTorch.COM(0), ArgumentError, r"total_classes"),
        (lambda: SpeedTorch.DataGadget("d.npy", "yes"), ArgumentError, r"CPUPinn"),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_bad_arguments_are_named_as_speedtorch_names_them(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_refused_naming_the_argument():
    with pytest.raises(ArgumentError, match=r"deviceType .*CUDA is not available"):
        SpeedTorch.PytorchModelFactory(_emb(), 10, DIM, torch.float, "cuda")
    factory = SpeedTorch.PytorchModelFactory(_emb(), 10, DIM)  # the default falls back
    assert factory.device == torch.device("cpu")


def test_a_second_factory_on_one_embedding_takes_the_gradient_hook_over():
    import gc

    embedding = torch.nn.Embedding(2, 2)
    first = SpeedTorch.ModelFactory(embedding, 10, 2)
    first.zerosInit()
    first.beforeForwardPass(np.array([[1, 1, 2]]))
    embedding(torch.arange(3)).sum().backward()
    second = SpeedTorch.ModelFactory(embedding, 10, 2)
    second.zerosInit()
    second.beforeForwardPass(np.array([[3, 4, 5]]))
    embedding.weight.grad = None
    weights = torch.tensor([[1.0], [10.0], [100.0]])
    (embedding(torch.arange(3)) * weights).sum().backward()
    # three distinct ids: each row keeps its own gradient (the old hook would have summed
    # rows 0 and 1 by the first factory's repeated id)
    torch.testing.assert_close(embedding.weight.grad, weights.expand(3, 2))
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is None  # the model does not keep an old factory (and its table) alive


def test_datagadget_refuses_rows_of_the_wrong_shape_and_datatype_none(tmp_path):
    path = tmp_path / "rows.npy"
    np.save(path, np.zeros((6, 3), np.float32))
    gadget = SpeedTorch.DataGadget(str(path))
    gadget.gadgetInit()
    with pytest.raises(ArgumentError, match=r"dataObject must be 2 rows of shape \(3,\)"):
        gadget.insertData(torch.ones(2, 6), np.array([0, 1]))
    gadget.insertData(torch.ones(2, 3), np.array([0, 1]))
    assert gadget.getNumpyVersion()[:2].sum() == 6
    with pytest.raises(ArgumentError, match="datatype must be a float dtype"):
        SpeedTorch.ModelFactory(torch.nn.Embedding(2, 2), 10, 2, None)
