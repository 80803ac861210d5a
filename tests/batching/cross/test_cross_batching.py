"""One Craft batched under torch and under JAX: the same members, outputs and gradients."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402
from dualtrain_jax import batching as jax_batching  # noqa: E402
from dualtrain_torch import batching as torch_batching  # noqa: E402
from tests.batching.builders import RecipeNet, recipes  # noqa: E402


@settings(max_examples=3)
@given(recipe=recipes, n=st.integers(1, 3), seed=st.integers(0, 2**64 - 1), train=st.booleans())
def test_torch_and_jax_members_agree_for_the_same_craft_and_seed(recipe, n, seed, train):
    craft = RecipeNet(recipe)
    tb = torch_batching.BatchModule(
        dualtrain_torch.realize(craft, dtype="float64"), n, seed=seed, strategy="vmap"
    )
    tb.train(train)
    x = np.random.default_rng(0).standard_normal((n, 3, *recipe.input_shape()))
    y = np.random.default_rng(1).integers(0, recipe.classes, (n, 3))
    tout = tb(torch.as_tensor(x))
    torch_batching.batch_loss(tout, torch.as_tensor(y), n).sum().backward()
    with jax.enable_x64(True):
        jb = jax_batching.BatchModule(
            dualtrain_jax.realize(craft, dtype="float64"), n, seed=seed, strategy="vmap"
        )
        for name, value in jb.params.items():  # the same weights, bit for bit
            np.testing.assert_array_equal(np.asarray(value), tb.stack.get_parameter(name).detach())

        @jax.jit
        def step(params, state):
            def loss(params):
                out, new_state = jb.apply(params, state, jnp.asarray(x), train=train)
                return jax_batching.batch_loss(out, jnp.asarray(y), n).sum(), (out, new_state)

            return jax.value_and_grad(loss, has_aux=True)(params)

        (_, (jout, jstate)), grads = step(jb.params, jb.state)
        close = {"rtol": 1e-9, "atol": 1e-11}
        np.testing.assert_allclose(np.asarray(jout), tout.detach().numpy(), **close)
        for name, g in grads.items():
            np.testing.assert_allclose(
                np.asarray(g), tb.stack.get_parameter(name).grad.numpy(), **close
            )
        for name, value in jstate.items():
            np.testing.assert_allclose(
                np.asarray(value), tb.stack.get_buffer(name).numpy(), **close
            )


@pytest.mark.parametrize("name", ["BatchModule", "batch_loss", "batch_topk"])
def test_the_two_adapters_offer_the_same_signatures(name):
    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    t, j = getattr(torch_batching, name), getattr(jax_batching, name)
    assert shape(t) == shape(j)
    for method in ("from_modules", "extract", "insert", "explain", "tune"):
        if name == "BatchModule":
            assert callable(getattr(t, method)) and callable(getattr(j, method))
    if name == "BatchModule":
        assert shape(t.from_modules) == shape(j.from_modules)
