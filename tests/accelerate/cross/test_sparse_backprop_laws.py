"""Top-k backprop gives the same gradients under torch and JAX: same weights, inputs and k."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.craft import Craft, dock
from tests.accelerate.test_topk import FEW_SHAPES, dense_cases, distinct_rows

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy
from dualtrain_jax import craft as jcraft  # noqa: E402
from dualtrain_jax.sparse_backprop import patch_dense, topk_dense  # noqa: E402
from dualtrain_torch import craft as tcraft  # noqa: E402
from dualtrain_torch.sparse_backprop import patch_linears, topk_linear  # noqa: E402

TOL = {"rtol": 1e-10, "atol": 1e-12}


@functools.partial(jax.jit, static_argnums=(4,))
def _jax_grads(x, w, b, g, k):
    return jax.grad(lambda x, w, b: jnp.sum(topk_dense(x, w, b, k) * g), argnums=(0, 1, 2))(x, w, b)


@settings(max_examples=20)
@given(case=dense_cases(shapes=FEW_SHAPES))
def test_one_layer_gives_the_same_gradients_in_both(case):
    with jax.enable_x64(True):
        want = [np.asarray(v) for v in _jax_grads(case.x, case.weight, case.bias, case.grad, case.k)
                if v is not None]  # fmt: skip
    leaves = [torch.from_numpy(a).requires_grad_() for a in (case.x, case.weight)]
    bias = None if case.bias is None else torch.from_numpy(case.bias).requires_grad_()
    y = topk_linear(leaves[0], leaves[1], bias, case.k)
    (y * torch.from_numpy(case.grad)).sum().backward()
    got = [t.grad.numpy() for t in (*leaves, *([] if bias is None else [bias]))]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, **TOL)


@jax.jit
def _craft_grads(module, x, g):
    return jax.grad(lambda p: jnp.sum(module.apply(p, module.state, x)[0] * g))(module.params)


class Tower(Craft):
    """Dense -> tanh -> Dense -> tanh -> Dense on [B, T, C] inputs."""

    def __init__(self, n_in, hidden, n_out):
        super().__init__("TOWER")
        self.fc1 = dock.Dense(n_in, hidden)
        self.fc2 = dock.Dense(hidden, hidden, bias=False)
        self.head = dock.Dense(hidden, n_out)

    def run(self, x):
        return self.head(dock.tanh(self.fc2(dock.tanh(self.fc1(x)))))


@settings(max_examples=6)
@given(
    k=st.integers(1, 8),
    ratio=st.sampled_from([None, 0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_a_patched_craft_has_the_same_gradients_in_both(k, ratio, seed):
    dims = (5, 7, 3)
    k_or_none = None if ratio is not None else k
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 4, dims[0]))
    g = distinct_rows(rng, (2, 4, dims[2]))

    with jax.enable_x64(True):
        jm = jcraft.realize(Tower(*dims), seed=seed, dtype="float64")
        patched, j_found = patch_dense(jm, k=k_or_none, ratio=ratio)
        jgrads = _craft_grads(patched, x, g)

    tm = tcraft.realize(Tower(*dims), seed=seed, dtype="float64")
    t_found = patch_linears(tm, k=k_or_none, ratio=ratio)
    assert t_found == j_found
    (tm(torch.from_numpy(x)) * torch.from_numpy(g)).sum().backward()
    tgrads = {n: p.grad.numpy() for n, p in tm.named_parameters()}
    assert sorted(tgrads) == sorted(jgrads)
    for name, value in tgrads.items():
        np.testing.assert_allclose(value, np.asarray(jgrads[name]), err_msg=name, **TOL)
