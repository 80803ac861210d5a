# ruff: noqa: E501  (the README code below is quoted as written)
"""nebulgym migrated: its READMEs' code runs with the import prefix changed, its names keep
nebulgym's arguments, and what they build equals the plain model and dataset.

``nebulgym.X`` becomes ``dualtrain_torch.compat.nebulgym.X``. The README blocks below are
the code of nebulgym's two READMEs (the current one, and the technical README it replaced,
under both of its decorator names) with only that prefix changed; they run on small
generated images on the CPU.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.data import DataLoader, Dataset

from dualtrain.errors import ArgumentError
from dualtrain_torch.compat.nebulgym import RetiredError
from dualtrain_torch.compat.nebulgym.annotations.torch_annotations import (
    nebulgym_dataset,
    nebulgym_model,
    patch_dataset,
    patch_torch_module,
)
from dualtrain_torch.compat.nebulgym.base import NebulgymBackend
from dualtrain_torch.compat.nebulgym.data.bagua_dataset import BaguaDataset
from dualtrain_torch.compat.nebulgym.data.base import BaseDataset
from dualtrain_torch.compat.nebulgym.data.nebuly_dataset import NebulDataset
from dualtrain_torch.compat.nebulgym.decorators.helpers import suppress_stdout, suppress_warnings
from dualtrain_torch.compat.nebulgym.decorators.torch_decorators import (
    accelerate_dataset,
    accelerate_model,
)
from dualtrain_torch.compat.nebulgym.patches.pytorch.meprop_linear import (
    MePropLinear,
    MePropLinearFunction,
    me_prop_linear,
    patch_backward_pass,
)
from dualtrain_torch.compat.nebulgym.training_learners.base import TrainingLearner
from dualtrain_torch.compat.nebulgym.training_learners.model_engines import (
    ENGINE_MAP,
    BaseEngine,
    ORTEngine,
    RammerEngine,
    TorchEngine,
    TorchScriptEngine,
)

PREFIX = "dualtrain_torch.compat.nebulgym"

# ---- the READMEs' code, with the import prefix changed ---------------------------------------

# nebulgym's README (main, 7c30f45): `from nebulgym.decorators.torch_decorators import ...`.
README = """
from typing import List, Callable
import torch
from torch.utils.data import Dataset

from dualtrain_torch.compat.nebulgym.decorators.torch_decorators import accelerate_model, accelerate_dataset

# Add nebulgym annotation before defining your model. 
#  This model takes as input an image of resolution 224x224
@accelerate_model()
class CustomModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._avg_pool = torch.nn.AvgPool2d(4)
        self._linear = torch.nn.Linear(3136, 1024)
        self._relu = torch.nn.ReLU()
        self._linears = torch.nn.Sequential(
            torch.nn.BatchNorm1d(1024),
            torch.nn.Linear(1024, 2048),
            torch.nn.ReLU(),
            torch.nn.BatchNorm1d(2048),
            torch.nn.Linear(2048, 1024),
            torch.nn.ReLU(),
            torch.nn.BatchNorm1d(1024),
            torch.nn.Linear(1024, 512),
            torch.nn.ReLU(),
            torch.nn.BatchNorm1d(512),
            torch.nn.Linear(512, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 2),
        )

    def forward(self, x):
        x = self._avg_pool(x).mean(dim=-3).view(-1, 3136)
        x = self._relu(self._linear(x))
        return self._linears(x)


# Add nebulgym annotation before defining your dataset.
@accelerate_dataset()
class CustomDataset(Dataset):
    def __init__(self, img_paths: List[str], labelling_func: Callable, reading_func: Callable):
        self._images = img_paths
        self._labelling_func = labelling_func
        self._reading_func = reading_func

    def __getitem__(self, item):
        img_path = self._images[item]
        label = self._labelling_func(img_path)
        input_tensor = self._reading_func(img_path)
        return input_tensor, label

    def __len__(self):
        return len(self._images)    
"""  # noqa: W291 (the README's trailing spaces)

# The technical README (3b13af8): the same classes; its imports, comments and decorators.
TECHNICAL_TEXT = {
    "from typing import List, Callable\nimport torch": "from typing import List, Callable\n\nimport torch",
    "# Add nebulgym annotation before defining your model. \n#  This model": "# The model",
    "# Add nebulgym annotation before defining your dataset.\n": "",
    "return len(self._images)    \n": "return len(self._images)\n",
}
TECHNICAL = {
    "from dualtrain_torch.compat.nebulgym.decorators.torch_decorators import accelerate_model,"
    " accelerate_dataset": "from dualtrain_torch.compat.nebulgym.annotations.torch_annotations"
    " import patch_torch_module, patch_dataset",
    "@accelerate_model()": '@patch_torch_module(patch_backprop=True, backends=["PYTORCH"])',
    "@accelerate_dataset()": "@patch_dataset(preloaded_data=20, max_memory_size=None)",
    **TECHNICAL_TEXT,
}
# The same README after the rename of 0152c83: nebulgym_model / nebulgym_dataset.
RENAMED = {
    "from dualtrain_torch.compat.nebulgym.decorators.torch_decorators import accelerate_model,"
    " accelerate_dataset": "from dualtrain_torch.compat.nebulgym.annotations.torch_annotations"
    " import nebulgym_model, nebulgym_dataset\n",
    "@accelerate_model()": '@nebulgym_model(patch_backprop=True, backends=["PYTORCH"])',
    "@accelerate_dataset()": "@nebulgym_dataset(preloaded_data=20, max_memory_size=None)",
    **TECHNICAL_TEXT,
}
PLAIN = {"@accelerate_model()\n": "", "@accelerate_dataset()\n": ""}


def readme(changes: dict[str, str] | None = None) -> dict:
    """Executes the README block (with `changes`) and returns its namespace."""
    code = README
    for old, new in (changes or {}).items():
        assert old in code
        code = code.replace(old, new)
    namespace: dict = {"__name__": "nebulgym_readme"}
    exec(compile(code, "nebulgym README", "exec"), namespace)
    return namespace


# -- setup the README leaves to its reader: images by path, a label and a reading function --


def labelling_func(path: str) -> int:
    return int(path.split("_")[1])


def reading_func(path: str) -> torch.Tensor:
    seed = int(path.split("_")[0].removeprefix("img"))
    return torch.rand(3, 224, 224, generator=torch.Generator().manual_seed(seed))


PATHS = [f"img{i}_{i % 2}" for i in range(8)]


def train(model: torch.nn.Module, dataset: Dataset, epochs: int = 2) -> list[float]:
    loader = DataLoader(
        dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize(
    ("changes", "approximate"),
    [(None, True), (TECHNICAL, True), (RENAMED, True)],
    ids=["README", "technical README", "technical README, renamed"],
)
def test_readme_code_runs_as_written_and_trains_every_parameter(changes, approximate):
    ns = readme(changes)
    torch.manual_seed(0)
    model = ns["CustomModel"]()
    dataset = ns["CustomDataset"](PATHS, labelling_func, reading_func)
    assert isinstance(model, ns["CustomModel"]) and isinstance(dataset, ns["CustomDataset"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    losses = train(model, dataset)
    assert len(losses) == 4 and np.isfinite(losses).all()
    moved = [k for k, p in model.named_parameters() if not torch.equal(p, before[k])]
    # nebulgym's meProp (k = round(0.04 * 2) = 0 on the head) left all but the head's bias
    # without gradient; here every parameter trains.
    assert moved == [k for k, _ in model.named_parameters()]
    report = model.forward.explain()
    assert len(report.approximations) == (6 if approximate else 0)
    assert "_linears.12: top-1 of 2" in report.approximations[-1]
    stats = dataset.preloader.stats()
    assert stats["loads"] == 8 and stats["hits"] >= 8  # the second epoch came from the cache


def test_readme_model_and_dataset_equal_the_plain_ones():
    ns, plain = readme(), readme(PLAIN)
    torch.manual_seed(1)
    model = ns["CustomModel"]()
    reference = plain["CustomModel"]()
    reference.load_state_dict(model.state_dict())  # the same keys: the class is the user's
    dataset = ns["CustomDataset"](PATHS, labelling_func, reading_func)
    plain_dataset = plain["CustomDataset"](PATHS, labelling_func, reading_func)
    for i in [3, 1, 3, 7, 0]:
        x, y = dataset[i]
        want_x, want_y = plain_dataset[i]
        assert torch.equal(x, want_x) and y == want_y
    x = torch.stack([dataset[i][0] for i in range(4)])
    for mode in ("train", "eval"):
        getattr(model, mode)(), getattr(reference, mode)()
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


# ---- laws -----------------------------------------------------------------------------------

BACKENDS = st.lists(
    st.sampled_from(
        [*NebulgymBackend, "PYTORCH", "pytorch", "Onnxruntime", "TORCHSCRIPT", "RAMMER"]
    ),
    max_size=3,
)


def small_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 24), torch.nn.BatchNorm1d(24), torch.nn.ReLU(), torch.nn.Linear(24, 3)
    )


def decorated(decorator: Any, seed: int) -> torch.nn.Module:
    @decorator
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = small_model(seed)

        def forward(self, x):
            return self.body(x)

    return Net()


def outputs_and_grads(
    model: torch.nn.Module, x: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    out = model(x)
    out.square().sum().backward()
    return out.detach(), [torch.clone(p.grad) for p in model.parameters() if p.grad is not None]


@settings(max_examples=12, deadline=None)
@given(backends=BACKENDS, seed=st.integers(0, 2**16), batch=st.integers(2, 6))
def test_accelerated_model_gives_the_plain_models_outputs_and_gradients(backends, seed, batch):
    model = decorated(accelerate_model(False, backends=backends), seed)
    plain = small_model(seed)
    x = torch.randn(batch, 6, generator=torch.Generator().manual_seed(seed))
    got, want = outputs_and_grads(model, x), outputs_and_grads(plain, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    model.eval(), plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x), rtol=1e-6, atol=1e-6)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_patch_backprop_keeps_the_forward_and_the_dense_bias_gradients(seed):
    model = decorated(accelerate_model(), seed)  # nebulgym's default: patch_backprop=True
    plain = small_model(seed)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(seed))
    (out, grads), (want, want_grads) = outputs_and_grads(model, x), outputs_and_grads(plain, x)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    names = [n for n, _ in model.named_parameters()]
    # The biases of patched layers keep their dense gradient (meProp drops nothing there).
    for name, g, w in zip(names, grads, want_grads, strict=True):
        if name.endswith(("3.bias", "0.bias")):
            torch.testing.assert_close(g, w)
        assert g.abs().sum() > 0, name
    assert len(model.forward.explain().approximations) == 2


@settings(max_examples=10, deadline=None)
@given(backends=BACKENDS, extend=st.booleans(), seed=st.integers(0, 2**16))
def test_training_learner_by_position_equals_by_keyword(backends, extend, seed):
    logger = logging.getLogger("nebulgym-test")
    a = TrainingLearner(small_model(seed), backends, logger, extend)
    b = TrainingLearner(model=small_model(seed), backends=backends, logger=logger, extend=extend)
    assert (a.backends, a.extend, a.logger) == (b.backends, b.extend, b.logger)
    assert a.backends[-1] == "PYTORCH"
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)
    torch.testing.assert_close(a(x), small_model(seed)(x), rtol=0, atol=0)


@pytest.mark.parametrize("backend", list(NebulgymBackend))
def test_a_backend_member_and_its_string_are_the_same(backend):
    by_member = TrainingLearner(small_model(0), [backend])
    by_string = TrainingLearner(small_model(0), [backend.value.lower()])
    assert by_member.backends == by_string.backends
    assert backend == backend.value and NebulgymBackend(backend.value) is backend


def test_no_backends_is_the_default_ladder():
    default = TrainingLearner(small_model(0))
    assert TrainingLearner(small_model(0), []).backends == default.backends
    assert TrainingLearner(small_model(0), None).backends == default.backends


@settings(max_examples=12, deadline=None)
@given(
    order=st.lists(st.integers(0, 11), min_size=1, max_size=30),
    window=st.integers(1, 8),
    positional=st.booleans(),
)
def test_datasets_serve_the_plain_datasets_items_in_any_order(order, window, positional):
    g = torch.Generator().manual_seed(len(order))
    plain = torch.utils.data.TensorDataset(torch.randn(12, 3, generator=g), torch.arange(12))
    if positional:
        nebul = NebulDataset(plain, window, 2**20)
    else:
        nebul = NebulDataset(input_data=plain, preloaded_data=window, max_memory_size=2**20)
    assert (nebul.preloaded_data, nebul.max_memory_size) == (window, 2**20)

    @accelerate_dataset(preloaded_data=window)
    class Decorated(Dataset):
        def __getitem__(self, i):
            return plain[i]

        def __len__(self):
            return len(plain)

    served = [nebul, Decorated(), BaguaDataset(plain)]
    for i in order:
        want = plain[i]
        for dataset in served:
            got = dataset[i]
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert all(len(d) == 12 for d in served)
    assert isinstance(nebul, Dataset) and isinstance(nebul, BaseDataset)
    assert nebul._data is plain and served[2]._data is plain  # what nebulgym's subclasses read


@pytest.mark.parametrize("backend", list(ENGINE_MAP))
def test_engines_run_the_model_as_it_is(backend):
    model = small_model(3)
    engine = ENGINE_MAP[backend](model)
    assert isinstance(engine, BaseEngine) and engine.original_model is model
    x = torch.randn(4, 6)
    for mode in ("train", "eval"):
        assert getattr(engine, mode)() is engine
        assert model.training is (mode == "train")
        want = model(x)
        for run in (engine, engine.run, engine.forward, engine.predict):
            torch.testing.assert_close(run(x), want, rtol=1e-6, atol=1e-6)
    engine.train(update_torch_model=False)
    assert not model.training
    assert engine.explain().backends[-1] == "PYTORCH"
    assert "forward" not in model.__dict__  # the model itself is left as it was


def test_engine_classes_are_nebulgyms():
    engines = ENGINE_MAP
    assert engines == {
        NebulgymBackend.PYTORCH: TorchEngine,
        NebulgymBackend.TORCHSCRIPT: TorchScriptEngine,
        NebulgymBackend.ONNXRUNTIME: ORTEngine,
        NebulgymBackend.RAMMER: RammerEngine,
    }


@settings(max_examples=10, deadline=None)
@given(out=st.integers(1, 60), k=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_meprop_layer_function_and_patch_agree(out, k, seed):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(5, out)
    x = torch.randn(3, 5, requires_grad=True)
    layer = MePropLinear.from_linear_layer(linear)
    assert layer.weight is linear.weight and layer.k == max(1, round(0.04 * out))
    assert layer.k >= 1  # nebulgym's round(0.04 * out) was 0 up to 12 outputs
    patched = patch_backward_pass(torch.nn.Sequential(torch.nn.Linear(5, out)))
    patched[0].load_state_dict(linear.state_dict())
    want = torch.nn.functional.linear(x, linear.weight, linear.bias)
    for y in (layer(x), patched(x), me_prop_linear(x, linear.weight, linear.bias, layer.k)):
        torch.testing.assert_close(y, want, rtol=0, atol=0)
    g1 = torch.autograd.grad(layer(x).sum(), x)[0]
    g2 = torch.autograd.grad(patched(x).sum(), x)[0]
    g3 = torch.autograd.grad(
        MePropLinearFunction.apply(x, linear.weight, linear.bias, layer.k).sum(), x
    )[0]
    torch.testing.assert_close(g1, g2)
    torch.testing.assert_close(g1, g3)
    dense = torch.autograd.grad(
        me_prop_linear(x, linear.weight, linear.bias, max(k, out)).sum(), x
    )[0]
    torch.testing.assert_close(dense, torch.autograd.grad(want.sum(), x)[0])


def test_patch_backward_pass_on_a_bare_linear_returns_it_patched():
    linear = torch.nn.Linear(4, 30)
    assert patch_backward_pass(linear) is linear
    assert linear.topk_k == 1


# ---- nebulgym's meanings: extend, logger, helpers --------------------------------------------


def test_extend_true_reads_the_model_and_sets_its_mode():
    model = small_model(0)
    learner = TrainingLearner(model, ["PYTORCH"], None, True)
    assert learner.extend and learner.eval() is learner and not model.training
    assert learner.train() is learner and model.training
    assert list(learner.parameters()) == list(model.parameters())  # read through


def test_extend_false_leaves_the_model_alone_as_the_decorators_did():
    model = small_model(0)
    learner = TrainingLearner(model, ["PYTORCH"], None, False)
    learner.eval()
    assert model.training  # nebulgym's decorated eval() set the model's mode itself
    model.eval()
    learner.train()
    assert not model.training
    with pytest.raises(AttributeError, match=r"extend=False.*learner\.model\.parameters"):
        learner.parameters  # noqa: B018
    x = torch.randn(3, 6)
    torch.testing.assert_close(learner(x), model(x))


def test_the_logger_gets_the_decisions(caplog):
    logger = logging.getLogger("nebulgym-log")
    learner = TrainingLearner(small_model(0), ["PYTORCH"], logger)
    with caplog.at_level(logging.INFO, logger="nebulgym-log"):
        learner(torch.randn(3, 6))
        learner(torch.randn(3, 6))  # the same signature: nothing new to say
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "dualtrain.accelerate: train" in caplog.records[0].getMessage()
    caplog.clear()
    model = decorated(accelerate_model(False, backends=["PYTORCH"], logger=logger), 0)
    with caplog.at_level(logging.INFO, logger="nebulgym-log"):
        model(torch.randn(2, 6))
    assert len(caplog.records) == 1 and "PYTORCH" in caplog.records[0].getMessage()
    copy = pickle.loads(pickle.dumps(learner.model))  # the hook pickles with the model
    x = torch.randn(2, 6)
    torch.testing.assert_close(copy(x), learner.model(x))


def test_helpers_hide_warnings_and_output(capsys):
    @suppress_warnings
    def warns(x):
        warnings.warn("hidden", UserWarning, stacklevel=1)
        return x + 1

    @suppress_stdout
    def prints(x):
        print("hidden")
        return x * 2

    assert warns(1) == 2 and prints(2) == 4
    assert capsys.readouterr().out == ""
    assert warns.__name__ == "warns"


def test_decorators_used_bare_keep_their_modules_default():
    model = decorated(accelerate_model, 0)
    model(torch.randn(2, 6))
    assert model.forward.explain().approximations  # accelerate_model: patch_backprop=True
    for decorator in (patch_torch_module, nebulgym_model):
        model = decorated(decorator, 0)
        model(torch.randn(2, 6))
        assert not model.forward.explain().approximations  # the annotations: False

    for decorator in (accelerate_dataset, patch_dataset, nebulgym_dataset):

        @decorator
        class Items(Dataset):
            def __getitem__(self, i):
                return i * 2

            def __len__(self):
                return 4

        assert [Items()[i] for i in range(4)] == [0, 2, 4, 6]
        assert Items().preloader.preloaded_data == 20


# ---- every module path and name of nebulgym ---------------------------------------------------

# nebulgym's modules (main, and the technical README's `annotations`) and their public names.
NAMES = {
    "base": ["NebulgymBackend"],
    "decorators": [],
    "decorators.helpers": ["suppress_warnings", "suppress_stdout"],
    "decorators.torch_decorators": ["accelerate_model", "accelerate_dataset"],
    "annotations": [],
    "annotations.torch_annotations": [
        "patch_torch_module",
        "patch_dataset",
        "nebulgym_model",
        "nebulgym_dataset",
    ],
    "data": [],
    "data.base": ["BaseDataset"],
    "data.nebuly_dataset": ["NebulDataset"],
    "data.bagua_dataset": ["BaguaDataset", "CachedDataset"],
    "patches": [],
    "patches.pytorch": [],
    "patches.pytorch.meprop_linear": [
        "MePropLinearFunction",
        "me_prop_linear",
        "MePropLinear",
        "patch_backward_pass",
    ],
    "training_learners": [],
    "training_learners.base": ["TrainingLearner"],
    "training_learners.model_engines": [
        "ENGINE_MAP",
        "BaseEngine",
        "ORTEngine",
        "RammerEngine",
        "TorchEngine",
        "TorchScriptEngine",
    ],
    "training_learners.model_engines.base": ["BaseEngine"],
    "training_learners.model_engines.torch_engine": ["TorchEngine", "TorchScriptEngine"],
    "training_learners.model_engines.ort_engine": ["ORTEngine"],
    "training_learners.model_engines.rammer_engine": ["RammerEngine"],
    "training_learners.model_engines.utils": [],
}
RETIRED = {
    "data.nebuly_dataset": ["WindowLoader"],
    "training_learners.model_engines.utils": ["CallMethodFixingEnvRunner", "ATTRIBUTE_NAME"],
}


@pytest.mark.parametrize("module", sorted(NAMES))
def test_every_nebulgym_module_resolves_with_its_names(module):
    mod = importlib.import_module(f"{PREFIX}.{module}")
    for name in NAMES[module]:
        assert getattr(mod, name) is not None, name


@pytest.mark.parametrize(
    ("module", "name"), [(m, n) for m, names in sorted(RETIRED.items()) for n in names]
)
def test_internals_without_a_counterpart_raise_naming_the_dualtrain_way(module, name):
    with pytest.raises(RetiredError, match=rf"{name} is not provided: .*dualtrain") as caught:
        exec(f"from {PREFIX}.{module} import {name}", {})
    assert isinstance(caught.value, ImportError)
    mod = importlib.import_module(f"{PREFIX}.{module}")
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018


def test_signatures_are_nebulgyms():
    def params(fn):
        return [
            (p.name, p.default)
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

    empty = inspect.Parameter.empty
    assert params(TrainingLearner) == [
        ("model", empty),
        ("backends", None),
        ("logger", None),
        ("extend", True),
    ]
    assert params(NebulDataset) == [
        ("input_data", empty),
        ("preloaded_data", 20),
        ("max_memory_size", None),
    ]
    assert params(accelerate_model) == [("patch_backprop", True)]
    assert params(patch_torch_module) == params(nebulgym_model) == [("patch_backprop", False)]
    assert params(BaguaDataset) == [("input_data", empty)]
    assert params(TorchEngine) == [("model", empty)]
    assert params(MePropLinear.from_linear_layer) == [("linear_layer", empty)]
    assert params(me_prop_linear) == [
        ("input", empty),
        ("weight", empty),
        ("bias", empty),
        ("k", empty),
    ]
    assert params(TorchEngine(small_model(0)).train) == [("update_torch_model", True)]


# ---- bad input: the argument, its value and what it must be ----------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: TrainingLearner("model"), r"model must be a torch.nn.Module"),  # type: ignore[arg-type]
        (lambda: TrainingLearner(small_model(0), ["NOPE"]), r"backends must be names among"),
        (lambda: TrainingLearner(small_model(0), None, 42), r"logger must be None or a logging"),  # type: ignore[arg-type]
        (lambda: TrainingLearner(small_model(0), None, None, "no"), r"extend must be True or"),  # type: ignore[arg-type]
        (lambda: accelerate_model(extend=False), r"extend must be left out.*extend=False"),
        (lambda: accelerate_model("yes"), r"patch_backprop must be a bool or a dict"),
        (lambda: accelerate_model(backends=["GPU"]), r"backends must be names among"),
        (lambda: accelerate_model(logger="log"), r"logger must be None"),
        (lambda: accelerate_dataset(preloaded_data=-1), r"preloaded_data"),
        (lambda: accelerate_dataset(max_memory_size=-5), r"max_memory_size"),
        (lambda: NebulDataset(42), r"input_data must be a dataset.*got input_data='int'"),
        (lambda: NebulDataset([1, 2], -1), r"preloaded_data"),
        (lambda: patch_backward_pass(3), r"model must be a torch.nn.Module"),  # type: ignore[arg-type]
        (lambda: MePropLinear.from_linear_layer(torch.nn.ReLU()), r"linear_layer must be an"),  # type: ignore[arg-type]
        (
            lambda: me_prop_linear(torch.ones(1, 2), torch.ones(3, 2), None, 0),
            r"k must be an int >= 1; got k=0",
        ),
        (
            lambda: MePropLinearFunction.apply(torch.ones(1, 2), torch.ones(3, 2), None, 0),
            r"k must be an int >= 1",
        ),
        (lambda: TorchEngine("model"), r"model must be a torch.nn.Module; got model='str'"),  # type: ignore[arg-type]
        (lambda: TorchEngine(small_model(0)).eval("yes"), r"update_torch_model must be True"),  # type: ignore[arg-type]
        (lambda: suppress_warnings(3), r"target_func must be a function"),  # type: ignore[type-var]
        (lambda: NebulgymBackend("GPU"), None),
    ],
)
def test_bad_arguments_are_named_with_their_value(call, match):
    if match is None:  # the enum itself, as nebulgym's: ValueError
        with pytest.raises(ValueError, match="is not a valid NebulgymBackend"):
            call()
        return
    with pytest.raises(ArgumentError, match=match):
        call()
