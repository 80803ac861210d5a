"""Per-member training under JAX: member_optimizer equals N separate optax runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

from dualtrain.errors import ArgumentError, ShapeError  # noqa: E402
from dualtrain_jax.batching.optim import (  # noqa: E402
    MemberState,
    hyper_of,
    member_optimizer,
    set_active,
    set_hyper,
)
from tests.batching.member_cases import hyper_cases, member_value  # noqa: E402

TIGHT = {"rtol": 1e-9, "atol": 1e-12}


def stacked(n: int, seed: int = 0, dtype=np.float64) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.standard_normal((n, 3, 2)).astype(dtype)),
        "b": jnp.asarray(rng.standard_normal((n, 2)).astype(dtype)),
    }


def loss(params, x):
    return jnp.sum(jnp.tanh(x @ params["w"] + params["b"]) ** 2)


def data(n: int, seed: int = 1, dtype=np.float64):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((n, 5, 3)).astype(dtype))


def reference(name: str, keywords: dict, i: int):
    """optax's own optimizer for member i alone (torch's coupled decay for SGD and Adam)."""
    own = {k: member_value(v, i) for k, v in keywords.items()}
    decay = own.get("weight_decay", 0.0)
    if name == "sgd":
        tx = optax.chain(
            optax.add_decayed_weights(decay),
            optax.sgd(own["lr"], own.get("momentum", 0.0), own.get("nesterov", False)),
        )
    else:
        b1, b2 = own.get("betas", (0.9, 0.999))
        eps = own.get("eps", 1e-8)
        if name == "adam":
            tx = optax.chain(optax.add_decayed_weights(decay), optax.adam(own["lr"], b1, b2, eps))
        else:
            tx = optax.adamw(own["lr"], b1, b2, eps, weight_decay=decay)
    if own.get("max_grad_norm") is not None:
        tx = optax.chain(optax.clip_by_global_norm(own["max_grad_norm"]), tx)
    return tx


def member(tree, i: int):
    return jax.tree.map(lambda a: a[i], tree)


@settings(max_examples=6)
@given(case=hyper_cases(3, 3), steps=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_members_step_as_separate_optax_runs(case, steps, seed):
    name, n, keywords = case
    with jax.enable_x64(True):
        params, x = stacked(n, seed % 5), data(n)
        tx = member_optimizer(name, n, **keywords)
        state = tx.init(params)
        refs = [reference(name, keywords, i) for i in range(n)]
        singles = [member(params, i) for i in range(n)]
        states = [r.init(p) for r, p in zip(refs, singles, strict=True)]
        for _ in range(steps):
            grads = jax.vmap(jax.grad(loss))(params, x)
            updates, state = tx.update(grads, state, params)  # eager: no compile per example
            params = optax.apply_updates(params, updates)
            for i, r in enumerate(refs):
                g = jax.grad(loss)(singles[i], x[i])
                u, states[i] = r.update(g, states[i], singles[i])
                singles[i] = optax.apply_updates(singles[i], u)
        for i in range(n):
            for key in params:
                np.testing.assert_allclose(params[key][i], singles[i][key], **TIGHT)
        np.testing.assert_array_equal(state.inner.count, steps)


@settings(max_examples=5)
@given(case=hyper_cases(4, 4), mask=st.lists(st.booleans(), min_size=4, max_size=4))
def test_inactive_members_stay_bit_identical_while_others_move(case, mask):
    name, n, keywords = case
    with jax.enable_x64(True):
        params, x = stacked(n), data(n)
        params["b"] = params["b"].at[0, 0].set(-0.0)  # signed zeros survive too
        tx = member_optimizer(name, n, **{**keywords, "lr": 0.1})
        state = tx.init(params)
        grads = jax.vmap(jax.grad(loss))(params, x)
        updates, state = tx.update(grads, state, params)  # every member has state now
        params = optax.apply_updates(params, updates)
        active = np.array(mask[:n])
        state = set_active(state, active)
        before = jax.tree.leaves((params, state))
        for _ in range(2):
            grads = jax.vmap(jax.grad(loss))(params, x)
            updates, state = tx.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        after = jax.tree.leaves((params, state))
        for old, new in zip(before, after, strict=True):
            for i in np.flatnonzero(~active):
                np.testing.assert_array_equal(np.signbit(new[i]), np.signbit(old[i]))
                np.testing.assert_array_equal(new[i], old[i])
        for i in np.flatnonzero(active):
            assert not np.array_equal(params["w"][i], before[1][i])  # leaves: b, w, ...
            assert int(state.inner.count[i]) == 3


def test_set_hyper_between_steps_equals_optax_with_new_values():
    with jax.enable_x64(True):
        params, x = stacked(2), data(2)
        tx = member_optimizer("sgd", 2, lr=[0.1, 0.01], momentum=0.9, max_grad_norm=[1.0, 0.5])
        state = tx.init(params)
        lrs = [[0.1, 0.01], [0.05, 0.2], [0.0, 0.3]]
        singles = [member(params, i) for i in range(2)]
        refs = [
            optax.chain(optax.clip_by_global_norm(c), optax.inject_hyperparams(optax.sgd)(lr, 0.9))
            for lr, c in zip(lrs[0], [1.0, 0.5], strict=True)
        ]
        states = [r.init(p) for r, p in zip(refs, singles, strict=True)]
        for lr in lrs:
            state = set_hyper(state, lr=lr, max_grad_norm=[1.0, 0.5])
            grads = jax.vmap(jax.grad(loss))(params, x)
            updates, state = tx.update(grads, state, params)
            params = optax.apply_updates(params, updates)
            for i, r in enumerate(refs):
                states[i][1].hyperparams["learning_rate"] = jnp.asarray(lr[i])
                u, states[i] = r.update(jax.grad(loss)(singles[i], x[i]), states[i], singles[i])
                singles[i] = optax.apply_updates(singles[i], u)
        for i in range(2):
            for key in params:
                np.testing.assert_allclose(params[key][i], singles[i][key], **TIGHT)
        np.testing.assert_array_equal(hyper_of(state).lr, [0.0, 0.3])


def test_the_state_is_a_pytree_that_jit_and_tree_map_keep():
    params = stacked(3, dtype=np.float32)
    tx = member_optimizer(
        "adamw", 3, lr=[0.1, 0.2, 0.3], weight_decay=0.01, active=[True, False, True]
    )
    state = tx.init(params)
    leaves, tree = jax.tree.flatten(state)
    again = jax.tree.unflatten(tree, [np.asarray(leaf) for leaf in leaves])  # host round trip
    assert isinstance(again, MemberState) and again.name == "adamw"
    grads = jax.tree.map(jnp.ones_like, params)
    u1, s1 = jax.jit(tx.update)(grads, state, params)
    u2, s2 = jax.jit(tx.update)(grads, again, params)
    for a, b in zip(jax.tree.leaves((u1, s1)), jax.tree.leaves((u2, s2)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert u1["w"].dtype == jnp.float32  # float32 params stay float32, no x64 needed
    np.testing.assert_allclose(hyper_of(state).lr, [0.1, 0.2, 0.3], rtol=1e-7)


@pytest.mark.parametrize(
    ("keywords", "match"),
    [
        ({"name": "lamb"}, r"name must be one of \('sgd', 'adam', 'adamw'\)"),
        ({"lr": [0.1, 0.2, 0.3]}, r"lr must be a number or 2 numbers .*shape \(2,\)"),
        ({"lr": -0.1}, "lr must be"),
        ({"lr": np.array([0.1, np.inf])}, "lr must be"),
        ({"name": "adamw", "betas": (1.0, 0.9)}, r"betas\[0\] must be"),
        ({"name": "adam", "nesterov": True}, "nesterov must be its default False for 'adam'"),
        ({"active": [True]}, "active must be None or 2 bools"),
    ],
)
def test_bad_arguments_are_refused(keywords, match):
    arguments = {"name": "sgd", "batch": 2, "lr": 0.1} | keywords
    with pytest.raises(ArgumentError, match=match):
        member_optimizer(**arguments)


def test_bad_params_and_changes_are_refused():
    tx = member_optimizer("adam", 3, lr=0.1)
    with pytest.raises(ShapeError, match=r"params\['b'\] must have the member count"):
        tx.init(stacked(2))
    state = member_optimizer("adam", 2, lr=0.1).init(stacked(2, dtype=np.float32))
    with pytest.raises(ArgumentError, match="set_hyper keyword must be one of"):
        set_hyper(state, momentum=0.9)
    with pytest.raises(ArgumentError, match="max_grad_norm must be unchanged"):
        set_hyper(state, max_grad_norm=math.inf)
    with pytest.raises(ArgumentError, match="state must be a member_optimizer state"):
        set_hyper(optax.adam(0.1).init(stacked(2)), lr=0.1)


def test_a_jitted_step_compiles_once_across_steps_and_set_active():
    # The state sits where the params are committed, so its placement never changes the
    # step's compilation key (an uncommitted state compiled the step twice, then again
    # after set_active).
    from dualtrain_jax.batching.optim import set_active

    params = jax.device_put({"w": jnp.ones((3, 2))}, jax.devices()[0])
    tx = member_optimizer("adam", 3, lr=[0.1, 0.2, 0.3])

    @jax.jit
    def step(params, state):
        updates, state = tx.update(jax.tree_util.tree_map(jnp.ones_like, params), state, params)
        return optax.apply_updates(params, updates), state

    state = tx.init(params)
    for i in range(3):
        params, state = step(params, state)
        state = set_active(state, [True, i != 1, True])
    assert step._cache_size() == 1  # one executable (2 when the state was uncommitted)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_the_state_is_laid_out_as_vmapped_inject_hyperparams_and_init_compiles_nothing(name):
    """The state is what ``jax.vmap`` of optax.inject_hyperparams(...).init builds (the layout
    of earlier releases, so saved states load): same tree, shapes and dtypes. It is built in
    NumPy: init compiles no XLA program."""
    params = stacked(3, dtype=np.float32)
    tx = member_optimizer(name, 3, lr=[0.1, 0.2, 0.3], weight_decay=0.01)

    def sgd(learning_rate, momentum, weight_decay):
        return optax.chain(
            optax.add_decayed_weights(weight_decay), optax.sgd(learning_rate, momentum)
        )

    def adam(learning_rate, b1, b2, eps, weight_decay):
        return optax.chain(
            optax.add_decayed_weights(weight_decay), optax.adam(learning_rate, b1, b2, eps)
        )

    def adamw(learning_rate, b1, b2, eps, weight_decay):
        return optax.adamw(learning_rate, b1, b2, eps, weight_decay=weight_decay)

    factory = {"sgd": sgd, "adam": adam, "adamw": adamw}[name]
    values = {"learning_rate": jnp.asarray([0.1, 0.2, 0.3]), "weight_decay": jnp.full(3, 0.01)}
    if name == "sgd":
        values["momentum"] = jnp.zeros(3)
    else:
        values |= {"b1": jnp.full(3, 0.9), "b2": jnp.full(3, 0.999), "eps": jnp.full(3, 1e-8)}
    want = jax.vmap(lambda p, v: optax.inject_hyperparams(factory)(**v).init(p))(params, values)
    with jax.log_compiles(True):
        import logging

        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger("jax")
        logger.addHandler(handler)
        try:
            got = tx.init(params).inner
        finally:
            logger.removeHandler(handler)
    assert not [r for r in records if "Compiling" in r.getMessage()]
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype


@settings(max_examples=4, deadline=None)
@given(case=hyper_cases(4, 4), seed=st.integers(0, 2**16))
def test_a_jitted_float32_update_equals_optax_member_by_member(case, seed):
    """Under jit in float32 (as a training step runs it), member i's update and state equal
    optax's for member i alone, to float32 rounding."""
    name, n, keywords = case
    params, x = stacked(n, seed, np.float32), data(n, seed, np.float32)
    tx = member_optimizer(name, n, **keywords)
    state = tx.init(params)
    refs = [reference(name, keywords, i) for i in range(n)]
    states = [r.init(member(params, i)) for i, r in enumerate(refs)]
    step = jax.jit(tx.update)
    for _ in range(2):
        grads = jax.vmap(jax.grad(loss))(params, x)
        updates, state = step(grads, state, params)
        for i, r in enumerate(refs):
            u, states[i] = jax.jit(r.update)(member(grads, i), states[i], member(params, i))
            for key in u:
                np.testing.assert_allclose(updates[key][i], u[key], rtol=2e-5, atol=1e-6)
        params = optax.apply_updates(params, updates)
