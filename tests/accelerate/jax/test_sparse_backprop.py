"""Top-k backprop under JAX: exact when k reaches the features, the reference otherwise, and
a patched module that is its own pytree (jit, grad, tree_map) beside an untouched original."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings

from dualtrain.accelerate.topk import Approximation
from dualtrain.craft import Craft, dock
from dualtrain.errors import ArgumentError
from tests.accelerate.test_topk import FEW_SHAPES, dense_cases, reference_grads

jax = pytest.importorskip("jax")
jnp = jax.numpy
from dualtrain_jax import craft as jcraft  # noqa: E402
from dualtrain_jax.layers import LAYERS  # noqa: E402
from dualtrain_jax.sparse_backprop import (  # noqa: E402
    TopKJaxModule,
    patch_dense,
    topk_dense,
    unpatch_dense,
)


def dense_layer(x, w, b):
    """The ordinary Dense, as a realized module runs it."""
    spec = dock.Dense(w.shape[1], w.shape[0], bias=b is not None)
    return LAYERS[dock.Dense](spec, {"weight": w, "bias": b}, x)


@functools.partial(jax.jit, static_argnums=(0, 5))
def _grads(layer, x, w, b, g, k):
    def loss(x, w, b):
        y = layer(x, w, b) if k is None else layer(x, w, b, k)
        return jnp.sum(y * g)

    return jax.grad(loss, argnums=(0, 1, 2))(x, w, b)


def grads_of(layer, case, k=None):
    """Gradients of ``sum(layer(x, w, b) * G)`` with respect to x, w and b, under jit."""
    values = _grads(layer, case.x, case.weight, case.bias, case.grad, k)
    names = ("x", "weight", "bias")
    return {n: v for n, v in zip(names, values, strict=True) if v is not None}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=15)
@given(case=dense_cases(dense=True, shapes=FEW_SHAPES))
def test_k_at_or_past_the_features_gives_exactly_the_dense_gradients(dtype, case):
    case.x, case.weight, case.grad = (a.astype(dtype) for a in (case.x, case.weight, case.grad))
    case.bias = None if case.bias is None else case.bias.astype(dtype)
    with jax.enable_x64(dtype == "float64"):
        want, got = grads_of(dense_layer, case), grads_of(topk_dense, case, case.k)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == dtype
        assert np.array_equal(np.asarray(got[name]), np.asarray(want[name])), name


@settings(max_examples=20)
@given(case=dense_cases(dense=False, shapes=FEW_SHAPES))
def test_k_below_the_features_gives_the_reference_gradients(case):
    with jax.enable_x64(True):
        got = grads_of(topk_dense, case, case.k)
        y = topk_dense(case.x, case.weight, case.bias, case.k)
        assert y.dtype == jnp.float64
        np.testing.assert_array_equal(y, dense_layer(case.x, case.weight, case.bias))
    want = reference_grads(case)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_allclose(np.asarray(got[name]), value, rtol=1e-10, atol=1e-12)


# patched modules


class Mlp(Craft):
    def __init__(self, head=3):
        super().__init__("MLP")
        self.fc1, self.fc2 = dock.Dense(4, 8), dock.Dense(8, head)

    def run(self, x):
        return self.fc2(jnp.tanh(self.fc1(x)))


class Nested(Craft):
    """A nested Craft, a dict of heads, a Sequential, a layer used twice, no-bias Dense."""

    def __init__(self):
        super().__init__("NESTED")
        self.body = Mlp(6)
        self.shared = dock.Dense(6, 6, bias=False)
        self.heads = {"a": dock.Dense(6, 5)}
        self.seq = dock.Sequential(dock.Dropout(0.25), dock.Dense(5, 2))

    def run(self, x):
        return self.seq(self.heads["a"](self.shared(self.shared(self.body(x)))))


X = np.random.default_rng(0).normal(size=(3, 2, 4)).astype(np.float32)  # [B, T, C]


@jax.jit
def loss_grads(module, x=X):
    """Gradients of a squared-output loss; the module is a pytree argument (its patch too)."""

    def loss(params):
        out, _ = module.apply(params, module.state, x)
        return sum(jnp.sum(o**2) for o in jax.tree_util.tree_leaves(out))

    return jax.grad(loss)(module.params)


def test_the_layers_are_named_as_their_parameters():
    module = jcraft.realize(Nested(), seed=0)
    _, found = patch_dense(module, ratio=0.5)
    assert found == [
        Approximation("body.fc1", 8, 4),
        Approximation("body.fc2", 6, 3),
        Approximation("shared", 6, 3),
        Approximation("heads.a", 5, 2),
        Approximation("seq.1", 2, 1),
    ]
    assert {f"{a.layer}.weight" for a in found} <= set(module.params)


def test_a_patched_module_works_under_jit_and_grad_and_leaves_the_original_alone():
    module = jcraft.realize(Nested(), seed=1)
    params = module.params
    dense = loss_grads(module)
    patched, _ = patch_dense(module, k=1)
    assert type(module) is jcraft.JaxModule and module.params is params
    assert isinstance(patched, TopKJaxModule) and isinstance(patched, jcraft.JaxModule)
    sparse = loss_grads(patched)
    assert sorted(sparse) == sorted(dense)
    assert any(not np.array_equal(sparse[n], dense[n]) for n in dense)  # it does approximate
    for n in dense:  # and every parameter still learns
        assert np.abs(np.asarray(sparse[n])).sum() > 0, n
    np.testing.assert_array_equal(loss_grads(module)["seq.1.weight"], dense["seq.1.weight"])
    # the forward is the same
    np.testing.assert_array_equal(patched(X), module(X))


def test_k_reaching_every_layers_features_is_the_original_bit_for_bit():
    module = jcraft.realize(Nested(), seed=2)
    patched, found = patch_dense(module, k=8)
    assert all(a.dense for a in found)
    dense, exact = loss_grads(module), loss_grads(patched)
    for n in dense:
        assert np.array_equal(exact[n], dense[n]), n


def test_the_patch_survives_tree_map_jit_and_replace():
    module = jcraft.realize(Mlp(), seed=0)
    patched, _ = patch_dense(module, k=2)
    patched.train = True
    copied = jax.tree_util.tree_map(lambda a: a, patched)
    assert type(copied) is TopKJaxModule
    assert copied.topk == (("fc1", 2), ("fc2", 2)) and copied.train
    through = jax.jit(lambda m: m)(patched)
    assert type(through) is TopKJaxModule and through.topk == patched.topk
    replaced = patched.replace(params={n: v * 2 for n, v in patched.params.items()})
    assert type(replaced) is TopKJaxModule and replaced.topk == patched.topk
    assert "top-k backprop on 2 Dense" in repr(patched)


def test_repatching_updates_k_and_unpatching_gives_a_plain_module():
    module = jcraft.realize(Mlp(), seed=0)
    once, _ = patch_dense(module, k=2)
    twice, found = patch_dense(once, k=5)
    assert twice.topk == (("fc1", 5), ("fc2", 5)) and [a.dense for a in found] == [False, True]
    plain = unpatch_dense(twice)
    assert type(plain) is jcraft.JaxModule
    for n, g in loss_grads(plain).items():
        assert np.array_equal(g, loss_grads(module)[n]), n


class Heads(Craft):
    """Twelve small heads (1 to 12 outputs), each behind its own hidden layer."""

    def __init__(self):
        super().__init__("HEADS")
        self.hidden = [dock.Dense(4, 5) for _ in range(12)]
        self.heads = [dock.Dense(5, n) for n in range(1, 13)]

    def run(self, x):
        return [head(jnp.tanh(h(x))) for h, head in zip(self.hidden, self.heads, strict=True)]


def test_small_heads_still_send_gradient_upstream():
    module = jcraft.realize(Heads(), seed=3)
    patched, found = patch_dense(module)  # the default ratio: nebulgym's k was 0 for all
    assert [a.k for a in found] == [1] * 24
    assert [a.dense for a in found[12:]] == [True] + [False] * 11  # 1 of 1 output is exact

    grads = loss_grads(patched)
    for n in range(12):
        assert np.abs(np.asarray(grads[f"hidden.{n}.weight"])).sum() > 0, n


def test_bad_arguments_are_refused():
    module = jcraft.realize(Mlp(), seed=0)
    with pytest.raises(ArgumentError, match="k must be an int >= 1; got k=0"):
        patch_dense(module, k=0)
    with pytest.raises(ArgumentError, match=r"ratio must be a number in \(0, 1\]; got ratio=0"):
        patch_dense(module, ratio=0)
    with pytest.raises(ArgumentError, match="module must be a realized"):
        patch_dense("module")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=r"k must be an int >= 1; got k=1\.5"):
        topk_dense(X, np.ones((3, 4), np.float32), None, 1.5)  # type: ignore[arg-type]
