"""What one realization refuses, the other refuses too: the same error class and message.

A catalogue of bad Crafts and inputs runs under torch, JAX (eager and jitted) and the NumPy
reference; each must raise the same house error with the same message. Embedding ids out of
range raise `OutOfRangeError` (an IndexError too) wherever the ids are concrete; under
``jit`` they give NaN rows, never another row.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from dualtrain.craft import Craft, dock, reference_forward
from dualtrain.errors import DualtrainError, OutOfRangeError, ShapeError

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy
from dualtrain_jax import craft as jcraft  # noqa: E402
from dualtrain_torch import craft as tcraft  # noqa: E402


class One(Craft):
    """A Craft of one layer."""

    def __init__(self, layer):
        super().__init__("ONE")
        self.layer = layer

    def run(self, x):
        return self.layer(x)


class Call(Craft):
    """A Craft calling its layer with a second, call-time argument."""

    def __init__(self, layer, arg):
        super().__init__("CALL")
        self.layer, self.arg = layer, arg

    def run(self, x):
        return self.layer(x, self.arg)


class Parts(Craft):
    """A Craft whose parts are set by name, to try names that collide or vanish."""

    def __init__(self, **parts):
        super().__init__("PARTS")
        for name, part in parts.items():
            setattr(self, name, part)
        self.names = list(parts)

    def run(self, x):
        return x


def _collide():
    craft = Parts(a={"b": dock.Dense(2, 2)})
    setattr(craft, "a.b", dock.Dense(2, 2))  # would be named a.b.weight as well
    return craft


def _f32(*shape):
    return np.ones(shape, np.float32)


# (id, Craft factory, input, train)
CASES = [
    ("conv-kernel-too-big", lambda: One(dock.Conv(1, 1, 3)), _f32(1, 1, 2, 2), False),
    ("conv-dilated", lambda: One(dock.Conv(1, 1, 3, dilation=2)), _f32(1, 1, 4, 4), False),
    ("conv-1d", lambda: One(dock.Conv(2, 1, (5,))), _f32(1, 2, 3), False),
    ("conv-3d-strided", lambda: One(dock.Conv(1, 1, (2, 2, 2))), _f32(1, 1, 1, 4, 4), False),
    ("conv-empty-axis", lambda: One(dock.Conv(1, 1, 1)), _f32(1, 1, 0, 2), False),
    ("maxpool-too-big", lambda: One(dock.MaxPool(3)), _f32(1, 1, 2, 2), False),
    ("avgpool-too-big", lambda: One(dock.AvgPool((2, 4))), _f32(1, 1, 2, 3), False),
    (
        "convT-negative",
        lambda: One(dock.ConvTranspose(1, 1, 1, padding=1)),
        _f32(1, 1, 1, 1),
        False,
    ),
    ("convT-zero", lambda: One(dock.ConvTranspose(1, 1, 1, padding=1)), _f32(1, 1, 2, 2), False),
    ("flatten-high", lambda: One(dock.Flatten(4)), _f32(1, 1, 2, 2), False),
    ("flatten-low", lambda: One(dock.Flatten(-5)), _f32(1, 1, 2, 2), False),
    ("flatten-1d", lambda: One(dock.Flatten(1)), _f32(3), False),
    ("batchnorm-one-value", lambda: One(dock.BatchNorm(3)), _f32(1, 3), True),
    ("batchnorm-one-pixel", lambda: One(dock.BatchNorm(3)), _f32(1, 3, 1, 1), True),
    ("batchnorm-channels", lambda: One(dock.BatchNorm(3)), _f32(2, 4), False),
    ("dense-features", lambda: One(dock.Dense(3, 2)), _f32(2, 4), False),
    ("names-collide", _collide, _f32(1, 2), False),
    ("name-with-dot-in-dict", lambda: Parts(d={"x.y": dock.Dense(2, 2)}), _f32(1, 2), False),
    ("empty-name-in-dict", lambda: Parts(d={"": dock.Dense(2, 2)}), _f32(1, 2), False),
    ("reshape-size", lambda: One(dock.Reshape((4, 2))), _f32(3, 2), False),
    ("reshape-no-fit", lambda: One(dock.Reshape((-1, 4))), _f32(3, 2), False),
    ("reshape-at-call", lambda: Call(dock.Reshape(), (5, -1)), _f32(3, 2), False),
    ("reshape-none", lambda: One(dock.Reshape()), _f32(3, 2), False),
    ("embedding-minus-one", lambda: One(dock.Embedding(5, 2)), np.array([0, -1]), False),
    ("embedding-num", lambda: One(dock.Embedding(5, 2)), np.array([[1, 5]]), False),
    ("embedding-float-ids", lambda: One(dock.Embedding(5, 2)), np.array([1.0], np.float32), False),
]


def _torch(craft, x, train):
    module = tcraft.realize(craft, seed=0)
    module.train(train)
    return module(torch.from_numpy(x))


def _jax(craft, x, train, jit=False):
    module = jcraft.realize(craft, seed=0)
    key = jax.random.PRNGKey(0)

    def apply(p, s, x):
        return module.apply(p, s, x, train=train, rng=key)

    return (jax.jit(apply) if jit else apply)(module.params, module.state, jnp.asarray(x))


def _reference(craft, x, train):
    return reference_forward(craft, craft.init(0, "float64"), x, train=train)


def _outcome(run, *args):
    try:
        run(*args)
    except Exception as exc:  # the test compares what each framework raised
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize(
    ("factory", "x", "train"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_torch_and_jax_refuse_alike(factory, x, train):
    torch_out = _outcome(_torch, factory(), x, train)
    assert torch_out is not None, "torch accepted it"
    cls, message = torch_out
    assert issubclass(cls, DualtrainError), message
    assert _outcome(_jax, factory(), x, train) == torch_out
    assert _outcome(_reference, factory(), x, train) == torch_out
    if not np.issubdtype(x.dtype, np.integer):  # values are not known under jit
        assert _outcome(_jax, factory(), x, train, True) == torch_out


def test_out_of_range_ids_are_an_index_error_too():
    with pytest.raises(IndexError, match=r"Embedding ids holds id -1 at position \(1,\)"):
        _torch(One(dock.Embedding(5, 2)), np.array([0, -1]), False)
    with pytest.raises(OutOfRangeError, match=r"expected ids in \[0, 5\)"):
        _jax(One(dock.Embedding(5, 2)), np.array([0, -1]), False)


@given(bad=st.one_of(st.integers(-50, -1), st.integers(7, 50)), good=st.integers(0, 6))
def test_traced_out_of_range_ids_give_nan_rows_never_another_row(bad, good):
    craft = One(dock.Embedding(7, 3))
    module = jcraft.realize(craft, seed=1)
    out = jax.jit(lambda p, s, ids: module.apply(p, s, ids)[0])(
        module.params, module.state, jnp.array([good, bad])
    )
    np.testing.assert_array_equal(out[0], module.params["layer.weight"][good])
    assert np.isnan(np.asarray(out[1])).all()


def test_jitted_shape_refusals_happen_at_trace_time():
    with pytest.raises(ShapeError, match="gives no output"):
        _jax(One(dock.MaxPool(3)), _f32(1, 1, 2, 2), False, True)


@pytest.mark.parametrize("name", ["train", "forward", "craft", "training", "keys", "state"])
def test_names_that_are_module_attributes_realize_alike(name):
    """torch's add_module refuses these; both realizations take them, with the same names."""
    craft = Parts(**{name: dock.Dense(2, 3), "d": {name: dock.Dense(3, 2)}})
    t = tcraft.realize(craft, seed=4)
    j = jcraft.realize(craft, seed=4)
    tnames = {k: v.detach().numpy() for k, v in t.state_dict().items()}
    assert (
        sorted(tnames)
        == sorted(j.params)
        == sorted([f"{name}.weight", f"{name}.bias", f"d.{name}.weight", f"d.{name}.bias"])
    )
    for key, value in tnames.items():
        np.testing.assert_array_equal(value, np.asarray(j.params[key]))
