"""JAX model batching as an adversarial user tries it: each test pins a defect found and fixed.

Pickling a BatchModule, integer leaves in a pair's params, pytree outputs given to
batch_loss, set_hyper under jit, and a named member set replaced by a smaller one.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

import dualtrain_jax  # noqa: E402
from dualtrain.checkpoint import TimeMachine  # noqa: E402
from dualtrain.errors import ArgumentError, CheckpointError, ShapeError  # noqa: E402
from dualtrain_jax.batching import BatchModule, batch_loss, batch_topk  # noqa: E402
from dualtrain_jax.batching.optim import member_optimizer, set_active, set_hyper  # noqa: E402
from tests.checkpoint.crafts import Net  # noqa: E402


def _net(n: int, seed: int = 1, **kwargs) -> BatchModule:
    return BatchModule(dualtrain_jax.realize(Net(hidden=4)), n, seed=seed, **kwargs)


def test_a_batch_module_pickles_as_a_jax_module_does():
    """A BatchModule over a realized Craft pickles (a JaxModule does); the copy runs the same
    members, eagerly and under jit, and keeps the measured decision."""
    bm = _net(3)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 4, 3)), jnp.float32)
    expected = np.asarray(bm(x))
    copy = pickle.loads(pickle.dumps(bm))
    np.testing.assert_array_equal(np.asarray(copy(x)), expected)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda b, x: b(x))(copy, x)), expected)
    assert copy.explain() == bm.explain()


@pytest.mark.parametrize("strategy", ["auto", "vmap", "map", "loop"])
def test_a_pair_with_an_integer_param_leaf_runs_under_every_strategy(strategy):
    """An integer leaf in a pair's params (a count, an index) gets a float0 gradient: the
    timing and the isolation probe must not choke on it."""
    params = {"scale": jnp.arange(1, 4, dtype=jnp.int32), "shift": jnp.ones(3)}

    def apply_fn(p, x):
        return x * p["scale"] + p["shift"]

    bm = BatchModule((params, apply_fn), 2, init="identical", strategy=strategy)
    out = bm(jnp.ones((2, 4, 3)))
    np.testing.assert_array_equal(np.asarray(out), np.broadcast_to([2.0, 3.0, 4.0], (2, 4, 3)))
    assert "passed" in bm.explain()


@pytest.mark.parametrize("outputs", [{"logits": jnp.ones((2, 3, 4))}, (jnp.ones((2, 3, 4)),)])
def test_batch_loss_and_topk_refuse_pytree_outputs_with_a_house_error(outputs):
    """A BatchModule may return a pytree; handing it whole to batch_loss or batch_topk is
    refused naming `outputs`, not an AttributeError from inside."""
    targets = jnp.zeros((3,), jnp.int32)
    with pytest.raises(ArgumentError, match="outputs must be one array"):
        batch_loss(outputs, targets, 2)
    with pytest.raises(ArgumentError, match="outputs must be one array"):
        batch_topk(outputs, targets, 2, ks=(1,))


def test_set_hyper_under_jit_is_refused_clearly():
    """set_hyper checks values on the host: under jit it says so (not a tracer conversion
    error from NumPy), for a traced state and for traced values alike."""
    bm = _net(3, check_isolation=False)
    state = member_optimizer("sgd", 3, lr=0.1).init(bm.params)
    with pytest.raises(ArgumentError, match="outside jit"):
        jax.jit(lambda s: set_hyper(s, lr=0.5))(state)
    with pytest.raises(ArgumentError, match="outside jit"):
        jax.jit(lambda lr: set_hyper(state, lr=lr))(jnp.array([0.1, 0.2, 0.3]))
    with pytest.raises(ArgumentError, match="outside jit"):
        jax.jit(lambda s: set_active(s, [True, False, True]))(state)
    assert set_hyper(state, lr=0.5).inner.hyperparams["learning_rate"].shape == (3,)


def test_a_named_set_replaced_by_a_smaller_one_leaves_no_stale_member(tmp_path):
    """drop_members(bm2, "best") replaces a 3-member set "best": member 2 of the old set
    must go, or to_members of 3 members would load a mix of both sets."""
    tm = TimeMachine(ckpt_path=tmp_path, save_path=tmp_path)
    tm.drop_members(_net(3, seed=1, check_isolation=False), "best")
    tm.drop(_net(2, seed=5, check_isolation=False), "best%m7x", member=0)  # not a member
    tm.drop_members(_net(2, seed=9, check_isolation=False), "best")
    assert sorted(os.listdir(tmp_path)) == [
        "best%m0.safetensors",
        "best%m1.safetensors",
        "best%m7x.safetensors",
    ]
    with pytest.raises(CheckpointError, match="best%m2"):
        tm.to_members(_net(3, seed=4, check_isolation=False), "best")


@pytest.mark.parametrize("strategy", ["auto", "vmap", "map", "loop"])
def test_arrays_inside_a_dict_or_list_input_are_split_per_member(strategy):
    """A pair's input may be a pytree: its ``[batch, B, ...]`` arrays reach member i as
    their row i (not whole, which gave ``[batch, batch, B, ...]`` outputs silently), and a
    wrong leading dimension inside is a ShapeError naming the leaf."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((3, 4, 2)), jnp.float32)
    inputs = {
        "x": jnp.asarray(rng.standard_normal((3, 5, 4)), jnp.float32),
        "b": [jnp.ones((3, 2))],
    }

    def apply_fn(p, d):
        return d["x"] @ p["w"] + d["b"][0]

    bm = BatchModule.from_modules([({"w": w[i]}, apply_fn) for i in range(3)], strategy=strategy)
    expected = np.stack([np.asarray(inputs["x"][i] @ w[i] + inputs["b"][0][i]) for i in range(3)])
    np.testing.assert_allclose(np.asarray(bm(inputs)), expected, rtol=1e-6, atol=1e-6)
    jitted = jax.jit(lambda b, d: b(d))(bm, inputs)
    np.testing.assert_allclose(np.asarray(jitted), expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ShapeError, match=r"inputs\[0\]\['x'\]"):
        bm({"x": inputs["x"][:2], "b": inputs["b"]})
