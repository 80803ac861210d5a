"""The JAX attachment's laws: lazy == the touched-rows reference, exact == dense optax
training, row-wise checks on the transformation, clear errors with nothing written back."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.errors import ArgumentError, ShapeError
from dualtrain_jax import attach
from tests.embeddings.runs import ROWS, batches, dense_jax, run_jax, store

TRANSFORMS = {
    "adam": optax.adam(0.05),
    "adamw": optax.adamw(0.05, weight_decay=0.1),
    "sgd-momentum": optax.sgd(0.1, momentum=0.9, nesterov=True),
    "adagrad": optax.adagrad(0.1),
    "rmsprop": optax.rmsprop(0.01, momentum=0.5),
    "chain": optax.chain(optax.clip(0.5), optax.scale_by_adam(), optax.scale(-0.05)),
}
TOL = {"rtol": 2e-5, "atol": 2e-6}


@pytest.mark.parametrize("mode", ["lazy", "exact"])
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
@settings(max_examples=8)
@given(steps=batches())
def test_modes_equal_their_dense_reference(mode, name, steps):
    """lazy == dense optax stepped on the touched rows only; exact == dense training."""
    s, _ = run_jax(TRANSFORMS[name], mode, steps)
    reference = dense_jax(TRANSFORMS[name], steps, touched_only=mode == "lazy")
    np.testing.assert_allclose(s.table, reference, **TOL)


@given(steps=batches(), name=st.sampled_from(sorted(TRANSFORMS)))
@settings(max_examples=15)
def test_untouched_rows_are_bit_identical_and_prefetch_changes_nothing(steps, name):
    a, _ = run_jax(TRANSFORMS[name], "lazy", steps)
    b, _ = run_jax(TRANSFORMS[name], "lazy", steps, prefetch=True)
    np.testing.assert_array_equal(a.table, b.table)
    untouched = np.setdiff1d(np.arange(ROWS), np.concatenate(steps))
    np.testing.assert_array_equal(a.table[untouched], store().table[untouched])


def test_no_update_is_lost_on_repeated_ids():
    s = store()
    before = s.table.copy()
    rows = attach(s, optax.sgd(1.0))
    a, b = rows.fetch(np.array([5, 5, 5]), np.array([[5], [2]]))
    rows.step(jnp.ones_like(a), jnp.ones_like(b))
    rows.flush()
    np.testing.assert_allclose(s.table[5], before[5] - 4.0, rtol=1e-6)
    np.testing.assert_allclose(s.table[2], before[2] - 1.0, rtol=1e-6)


@pytest.mark.parametrize(
    "tx",
    [
        optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1)),
        optax.adafactor(0.1),
        optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(1.0, 0.0, 10)),
    ],
    ids=["global-norm", "adafactor", "scheduled-hyperparameter"],
)
def test_transformations_without_a_row_wise_form_are_refused(tx):
    with pytest.raises(ArgumentError, match="row-wise"):
        attach(store(), tx)


def test_errors_write_nothing_back():
    s = store()
    rows = attach(s, optax.adam(0.1))
    table = s.table.copy()
    e = rows.fetch(np.array([1, 2, 2]))
    with pytest.raises(ShapeError, match=r"grads\[0\] has shape \(2, 3\); expected \(3, 3\)"):
        rows.step(jnp.ones((2, 3)))
    rows.fetch(np.array([1, 2, 2]))
    with pytest.raises(ArgumentError, match="2 gradient arrays"):
        rows.step(jnp.ones_like(e), jnp.ones_like(e))
    with pytest.raises(ArgumentError, match="fetch"):
        rows.step(jnp.ones_like(e))
    with pytest.raises(ArgumentError, match="row id -3"):
        rows.fetch(np.array([-3]))
    rows.flush()
    np.testing.assert_array_equal(s.table, table)
    assert not s.state["exp_avg"].any()


def test_step_is_one_compiled_function_per_padded_size():
    rows = attach(store(), optax.adam(0.1))
    for n in (3, 5, 9, 12):  # 12 ids, 3..12 of them unique: padded to 16 rows, one shape
        e = rows.fetch(np.arange(12) % n)
        rows.step(jax.numpy.ones_like(e))
    assert rows.plan.update._cache_size() == 1


@pytest.mark.parametrize("mode", ["lazy", "exact"])
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_every_transformation_trains_a_shard_as_one_process(mode, name):
    """Sharded over 2 thread ranks == one process on the union batch with the summed loss."""
    from tests.embeddings.ranks import shard_against_one

    got, single = shard_against_one("jax", lambda s: attach(s, TRANSFORMS[name], mode=mode))
    np.testing.assert_allclose(got["weight"], single.table, **TOL)
    for slot, table in single.state.items():
        np.testing.assert_allclose(got[slot], table, **TOL, err_msg=slot)
