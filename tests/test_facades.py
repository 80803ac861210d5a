"""The two adapters' top packages mirror each other: same names, same signatures, lazy."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dualtrain import Craft, dock

dualtrain_torch = pytest.importorskip("dualtrain_torch")
dualtrain_jax = pytest.importorskip("dualtrain_jax")
pytest.importorskip("torch")
pytest.importorskip("jax")

# Names that carry the framework in them: each adapter has its own.
OWN = {
    "torch": {"TorchBackend", "TorchRows"},
    "jax": {"JaxBackend", "JaxRows"},
}
SHARED = [
    "BatchModule",
    "TrainingLearner",
    "accelerate",
    "accelerate_model",
    "Nozzle",
    "Prober",
    "Rudder",
    "Transfer",
    "attach",
    "batch_loss",
    "batch_topk",
    "coat",
    "member_optimizer",
    "realize",
    "shell",
]


def shape(fn):
    """(name, kind, default) of each parameter, the signature up to annotations."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_both_export_the_same_names():
    torch_names = set(dualtrain_torch.__all__) - OWN["torch"]
    jax_names = set(dualtrain_jax.__all__) - OWN["jax"]
    assert torch_names == jax_names == set(SHARED)
    for package in (dualtrain_torch, dualtrain_jax):
        assert sorted(package._HOMES) == sorted(package.__all__)
        assert set(package.__all__) <= set(dir(package))
        for name in package.__all__:
            assert getattr(package, name) is not None
        with pytest.raises(AttributeError, match="no attribute 'nothing'"):
            package.nothing  # noqa: B018


# Checked by their own tests below: the frameworks' forms differ by design.
APART = ("attach", "member_optimizer", "accelerate", "accelerate_model", "TrainingLearner")


@pytest.mark.parametrize("name", [n for n in SHARED if n not in APART])
def test_shared_names_have_the_same_signature(name):
    assert shape(getattr(dualtrain_torch, name)) == shape(getattr(dualtrain_jax, name))


def test_member_optimizer_matches_but_for_torchs_params():
    """torch's optimizer is built over the parameters; optax's transformation meets them at
    ``init``, so JAX's has no ``params``. The rest lines up: names, kinds, defaults."""
    t, j = shape(dualtrain_torch.member_optimizer), shape(dualtrain_jax.member_optimizer)
    assert t[0] == ("params", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty)
    assert t[1:] == j
    assert j[:2] == [
        ("name", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
        ("batch", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
    ]


def test_realize_is_keyword_only_after_the_craft():
    expected = [
        ("craft", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
        ("seed", inspect.Parameter.KEYWORD_ONLY, 0),
        ("device", inspect.Parameter.KEYWORD_ONLY, None),
        ("dtype", inspect.Parameter.KEYWORD_ONLY, None),
    ]
    assert shape(dualtrain_torch.realize) == shape(dualtrain_jax.realize) == expected


def test_attach_matches_where_the_frameworks_allow():
    """The exception: torch takes an optimizer class and its keyword arguments (``**hyper``),
    optax a ready transformation. Everything else lines up: names, kinds, defaults."""
    t, j = shape(dualtrain_torch.attach), shape(dualtrain_jax.attach)
    assert t[1][0] == "optimizer" and j[1][0] == "transformation"
    assert t[-1][:2] == ("hyper", inspect.Parameter.VAR_KEYWORD)
    assert [p for i, p in enumerate(t[:-1]) if i != 1] == [p for i, p in enumerate(j) if i != 1]
    assert t[1][1:] == j[1][1:]


class Small(Craft):
    def __init__(self):
        super().__init__("SMALL")
        self.fc = dock.Dense(3, 2)

    def run(self, x):
        return self.fc(x)


def weights(module):
    if hasattr(module, "params"):
        return {k: np.asarray(v) for k, v in module.params.items()}
    return {k: v.detach().numpy() for k, v in module.named_parameters()}


@pytest.mark.parametrize(
    ("package", "old_args", "keywords"),
    [
        ("torch", (4, "cpu", "float64"), {"seed": 4, "device": "cpu", "dtype": "float64"}),
        ("torch", (4,), {"seed": 4}),
        ("jax", (4, "float32", None), {"seed": 4, "dtype": "float32", "device": None}),
        ("jax", (4, "float16"), {"seed": 4, "dtype": "float16"}),
    ],
)
def test_positional_arguments_warn_and_keep_each_adapters_old_order(package, old_args, keywords):
    realize = (dualtrain_torch if package == "torch" else dualtrain_jax).realize
    craft = Small()
    with pytest.warns(DeprecationWarning, match=rf"write dualtrain_{package}\.realize\(\.\.\., "):
        old = realize(craft, *old_args)
    new = realize(craft, **keywords)
    for name, value in weights(new).items():
        assert weights(old)[name].dtype == value.dtype
        np.testing.assert_array_equal(weights(old)[name], value)


def test_positional_misuse_is_still_a_type_error():
    with pytest.raises(TypeError, match="at most 4 positional"):
        dualtrain_torch.realize(Small(), 0, None, None, None)
    with pytest.raises(TypeError, match="multiple values for seed"):
        dualtrain_jax.realize(Small(), 0, seed=1)


def test_dtype_none_means_float32():
    assert dualtrain_torch.realize(Small()).fc.weight.dtype.is_floating_point
    assert str(dualtrain_torch.realize(Small(), dtype=None).fc.weight.dtype) == "torch.float32"
    assert str(dualtrain_jax.realize(Small(), dtype=None).params["fc.weight"].dtype) == "float32"


def test_the_facades_load_lazily():
    code = textwrap.dedent(
        """
        import sys
        import dualtrain_jax, dualtrain_torch
        assert "optax" not in sys.modules and "dualtrain_jax.craft" not in sys.modules
        assert "torch" not in sys.modules and "jax" not in sys.modules
        dualtrain_jax.realize
        assert "optax" not in sys.modules, "realize pulled in optax"
        dualtrain_jax.attach
        assert "optax" in sys.modules
        dualtrain_torch.realize
        assert "jax" not in str(sorted(m for m in sys.modules if m.startswith("dualtrain_torch")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


def test_accelerate_forms_line_up_but_for_what_each_framework_accelerates():
    """torch accelerates a module in place; JAX a function or a realized module (its
    first argument's name says so), with JAX's default ladder spelled out and JAX's
    ``donate_argnums``. The rest, ``**options`` included, is the same."""
    t, j = shape(dualtrain_torch.accelerate), shape(dualtrain_jax.accelerate)
    assert t[0][0] == "module" and j[0][0] == "fn_or_module"
    assert [p[:2] for p in t[1:3]] == [p[:2] for p in j[1:3]]
    assert t[1][2] is None and j[1][2] == ("JIT_DONATE", "JIT", "EAGER")
    assert t[2] == j[2] == ("patch_backprop", inspect.Parameter.POSITIONAL_OR_KEYWORD, False)
    assert t[-1][1] == j[-1][1] == inspect.Parameter.VAR_KEYWORD
    tl, jl = shape(dualtrain_torch.TrainingLearner), shape(dualtrain_jax.TrainingLearner)
    assert [p[0] for p in tl] == [p[0] for p in jl]
