"""Each dock spec's ``check_input`` is the one gate: it refuses an input iff running does.

For every kind in the dock catalogue, a fitting input (from `tests.strategies.dock_cases`)
is bent out of shape (an axis resized, dropped or added; ids out of range or of a float
dtype). Whatever ``spec.check_input`` raises, the realized torch and JAX modules and the
NumPy reference raise too, the same class and message; what it accepts, all three run.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.craft import Craft, dock, reference_forward
from dualtrain.errors import DualtrainError
from tests.strategies import LAYER_KINDS, dock_cases

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy
from dualtrain_jax import craft as jcraft  # noqa: E402
from dualtrain_torch import craft as tcraft  # noqa: E402

# Each example compiles fresh JAX kernels for its shapes: a quarter of the profile per kind.
FEW = settings(max_examples=max(5, settings().max_examples // 4))


class One(Craft):
    """A Craft of one layer."""

    def __init__(self, layer):
        super().__init__("ONE")
        self.layer = layer

    def run(self, x):
        return self.layer(x)


fitting: dict = {}  # layer -> the input it was drawn with (which fits it)


@st.composite
def bent_cases(draw, kind: str):
    """A dock layer of `kind`, an input that may no longer fit it, and the mode."""
    layer, x = draw(dock_cases(kind))
    fitting[layer] = x
    shape = list(x.shape)
    how = draw(st.sampled_from(["resize", "drop", "add", "keep"]))
    if how == "resize":
        shape[draw(st.integers(0, len(shape) - 1))] = draw(st.integers(0, 6))  # empty axes too
    elif how == "drop" and len(shape) > 1:
        del shape[draw(st.integers(0, len(shape) - 1))]
    elif how == "add":
        shape.insert(draw(st.integers(0, len(shape))), draw(st.integers(1, 3)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "Embedding":
        n = layer.num_embeddings
        lo, hi = (-2, n + 2) if draw(st.booleans()) else (0, n)  # out of range, or not
        ids = rng.integers(lo, hi, size=shape).astype(np.int32)
        x = ids.astype(np.float32) if draw(st.booleans()) else ids
    else:
        x = rng.normal(size=shape).astype(np.float32)
    return layer, x, draw(st.booleans())


def _outcome(run, *args, **kwargs):
    try:
        run(*args, **kwargs)
    except Exception as exc:  # the test compares what each path raised
        return type(exc), str(exc)
    return None


def _torch(layer, x, train):
    module = tcraft.realize(One(layer), seed=0)
    module.train(train)
    with torch.no_grad():
        return module(torch.from_numpy(x))


def _jax(layer, x, train):
    module = jcraft.realize(One(layer), seed=0)
    key = jax.random.PRNGKey(0)
    return module.apply(module.params, module.state, jnp.asarray(x), train=train, rng=key)


def _reference(layer, x, train):
    craft = One(layer)
    return reference_forward(craft, craft.init(0, "float32"), x, train=train)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@FEW
@given(data=st.data())
def test_check_input_refuses_exactly_what_each_backend_refuses(kind, data):
    layer, x, train = data.draw(bent_cases(kind))
    expected = _outcome(layer.check_input, x, train=train)
    if expected is not None:
        assert issubclass(expected[0], DualtrainError), expected
    for run in (_torch, _jax, _reference):
        assert _outcome(run, layer, x, train) == expected, run.__name__


def test_every_dock_layer_has_its_own_input_check():
    """Each concrete spec answers ``check_input``; the kinds with inputs to refuse override it."""
    kinds = [getattr(dock, name) for name in dock.__all__]
    specs = [k for k in kinds if isinstance(k, type) and issubclass(k, dock.Layer)]
    assert {k.__name__ for k in specs} >= set(LAYER_KINDS)
    for spec in specs:
        assert callable(getattr(spec, "check_input", None)), spec.__name__
    free = {"Layer", "Dropout", "Native", "Sequential"}  # they take any input
    for spec in specs:
        own = spec.check_input is not dock.Layer.check_input
        assert own == (spec.__name__ not in free), spec.__name__


@pytest.mark.parametrize(
    "layer",
    [
        dock.AvgPool(kernel=(1, 2), stride=(1, 1), padding=(0, 1)),
        dock.MaxPool(kernel=(1, 2), stride=(1, 1), padding=(0, 1)),
        dock.Conv(1, 1, (1, 2), padding=(0, 1), bias=False),
    ],
    ids=["AvgPool", "MaxPool", "Conv"],
)
def test_windows_refuse_an_empty_spatial_axis_even_with_padding(layer):
    # Found by the law above: padding made room for a window, torch still refuses.
    with pytest.raises(DualtrainError, match="spatial"):
        layer.check_input(np.zeros((1, 1, 1, 0), np.float32))


@pytest.mark.parametrize("kind", LAYER_KINDS)
@FEW
@given(data=st.data())
def test_a_check_remembered_for_one_input_never_passes_another(kind, data):
    """A realized torch module remembers the checks an input signature passed; a bent
    input, run after fitting ones, is still refused exactly as `check_input` refuses it."""
    layer, x, train = data.draw(bent_cases(kind))
    module = tcraft.realize(One(layer), seed=0)
    module.train(train)
    fit = fitting.pop(layer)
    fit = fit.astype(np.float32) if fit.dtype.kind == "f" else fit  # the parameters' dtype
    with torch.no_grad():
        for _ in range(2):  # the second call takes the remembered check
            module(torch.from_numpy(fit))
        for value in (x, x, x.astype(np.float64)):
            want = _outcome(layer.check_input, value, train=train)
            if want is None and value.dtype == np.float64:  # the dtype rule, checked too
                want = _outcome(_torch, layer, value, train)
            assert _outcome(module, torch.from_numpy(value)) == want


@pytest.mark.parametrize("layer", [dock.Dense(3, 2), dock.BatchNorm(3), dock.LayerNorm(3)])
def test_a_check_passed_under_autocast_is_made_again_outside_it(layer):
    """An input autocast lets through (bfloat16 into float32 weights) is refused outside it,
    however often it ran inside: only inputs of the weight's dtype are remembered."""
    module = tcraft.realize(One(layer), seed=0).eval()
    x = torch.ones(4, 3, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                module(x)
        with pytest.raises(DualtrainError, match="dtype"):
            module(x)


def test_an_op_with_no_array_names_the_problem():
    from dualtrain.errors import BackendError

    with pytest.raises(BackendError):
        dock.concat([])
