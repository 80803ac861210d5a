"""The JAX module is a lossless pytree: every static field survives flatten, jit, vmap, grad."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.craft import Craft, dock

jax = pytest.importorskip("jax")
jnp = jax.numpy
from dualtrain_jax import craft as jcraft  # noqa: E402


class Mlp(Craft):
    def __init__(self):
        super().__init__("MLP")
        self.fc1, self.drop, self.fc2 = dock.Dense(4, 8), dock.Dropout(0.5), dock.Dense(8, 3)

    def run(self, x):
        return self.fc2(self.drop(dock.relu(self.fc1(x))))


class Normed(Craft):
    def __init__(self):
        super().__init__("NORMED")
        self.fc, self.bn = dock.Dense(4, 6), dock.BatchNorm(6)
        self.heads = {"a": dock.Dense(6, 3)}

    def run(self, x):
        return self.heads["a"](self.bn(self.fc(x)))


class Nested(Craft):
    def __init__(self):
        super().__init__("NESTED")
        self.body, self.seq = Normed(), dock.Sequential(dock.Dropout(0.25), dock.Dense(3, 3))

    def run(self, x):
        return self.seq(self.body(x))


CRAFTS = (Mlp, Normed, Nested)
X = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
KEY = jax.random.key(7)


@st.composite
def modules(draw):
    craft = draw(st.sampled_from(CRAFTS))()
    module = jcraft.realize(craft, seed=draw(st.integers(0, 2**32)))
    module.train = draw(st.booleans())
    return module


def assert_same_module(got, want, arrays=True):
    """Every field the module holds: its type, Craft (the same object), mode, params, state."""
    assert type(got) is type(want)
    assert got.craft is want.craft
    assert got.train is want.train
    assert sorted(vars(got)) == sorted(vars(want))
    if arrays:
        for field in ("params", "state"):
            a, b = getattr(got, field), getattr(want, field)
            assert sorted(a) == sorted(b), field
            for name in a:
                np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), name)


@given(module=modules())
def test_flatten_then_unflatten_gives_an_equal_module(module):
    leaves, treedef = jax.tree_util.tree_flatten(module)
    assert_same_module(jax.tree_util.tree_unflatten(treedef, leaves), module)
    assert_same_module(jax.tree_util.tree_map(lambda x: x, module), module)


@settings(max_examples=10)
@given(module=modules())
def test_jit_vmap_and_grad_keep_the_static_fields(module):
    seen = []

    def identity(m):
        seen.append(m.train)
        return m

    assert_same_module(jax.jit(identity)(module), module)
    stacked = jax.tree_util.tree_map(lambda a: jnp.stack([a, a + 1]), module)
    assert_same_module(stacked, module, arrays=False)
    batched = jax.vmap(identity)(stacked)
    assert_same_module(batched, stacked)

    def loss(m):
        seen.append(m.train)
        return sum(jnp.sum(p**2) for p in m.params.values())

    grads = jax.grad(loss)(module)
    assert_same_module(grads, module, arrays=False)
    for name, p in module.params.items():
        np.testing.assert_allclose(np.asarray(grads.params[name]), 2 * np.asarray(p), rtol=1e-6)
    assert seen == [module.train] * 3


@pytest.mark.parametrize("craft", CRAFTS)
def test_a_module_in_training_mode_trains_under_jit(craft):
    """Under Rudder, ``net(x)`` inside jit runs in training mode, as it does eagerly."""
    module = jcraft.realize(craft(), seed=1)
    with jcraft.Rudder(module):
        jitted = jax.jit(lambda m, x: m(x, rng=KEY))(module, X)
        eager = module.replace()(X, rng=KEY)
        evaluated = module.apply(module.params, module.state, X, train=False)[0]
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(jitted), np.asarray(evaluated))


def test_a_transformation_works_on_a_copy_and_the_caller_keeps_its_module():
    """The mutability rule (docs/craft.md): rebinding inside jit does not reach the caller."""
    module = jcraft.realize(Normed(), seed=2)
    before = dict(module.state)

    def step(m, x):
        m(x)  # training mode: rebinds m.state on the copy
        return m

    with jcraft.Rudder(module):
        out = jax.jit(step)(module, X)
    assert module.train is False and out.train is True
    assert all(module.state[k] is before[k] for k in before)
    assert not np.allclose(np.asarray(out.state["bn.running_mean"]), before["bn.running_mean"])
