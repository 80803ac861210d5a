"""Members cross frameworks: a BatchModule's members dropped under one load under the other.

The laws (float64): a member dropped from a torch BatchModule is, loaded into a JAX
BatchModule, a JAX realize or a torch realize, the same model: the same outputs and, in
training with BatchNorm, the same gradients and running statistics; and back from JAX.
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402
from dualtrain.checkpoint import TimeMachine  # noqa: E402
from dualtrain_jax import batching as jax_batching  # noqa: E402
from dualtrain_torch import batching as torch_batching  # noqa: E402
from tests.batching.builders import RecipeNet, recipes  # noqa: E402

CLOSE = {"rtol": 1e-9, "atol": 1e-11}


def _data(recipe, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3, *recipe.input_shape()))
    y = rng.integers(0, recipe.classes, (n, 3))
    return x, y


def _torch_step(tb, x, y, n):
    """One SGD step in training: weights and running statistics move away from the init."""
    tb.train(True)
    opt = torch.optim.SGD(tb.parameters(), lr=0.1)
    torch_batching.batch_loss(tb(torch.as_tensor(x)), torch.as_tensor(y), n).sum().backward()
    opt.step()
    opt.zero_grad()


def _torch_run(tb, x, y, n):
    """Outputs, parameter gradients and updated buffers of a torch BatchModule, training."""
    tb.train(True)
    out = tb(torch.as_tensor(x))
    torch_batching.batch_loss(out, torch.as_tensor(y), n).sum().backward()
    grads = {k: p.grad.numpy().copy() for k, p in tb.stack.named_parameters()}
    state = {k: b.numpy().copy() for k, b in tb.stack.named_buffers()}
    return out.detach().numpy(), grads, state


def _jax_run(jb, x, y, n):
    """The same for a JAX BatchModule (under x64)."""

    @jax.jit
    def run(params, state):
        def loss(params):
            out, new_state = jb.apply(params, state, jnp.asarray(x), train=True)
            return jax_batching.batch_loss(out, jnp.asarray(y), n).sum(), (out, new_state)

        return jax.value_and_grad(loss, has_aux=True)(params)

    (_, (out, state)), grads = run(jb.params, jb.state)
    as_np = lambda tree: {k: np.asarray(v) for k, v in tree.items()}  # noqa: E731
    return np.asarray(out), as_np(grads), as_np(state)


def _assert_runs_agree(t_run, j_run):
    tout, tgrads, tstate = t_run
    jout, jgrads, jstate = j_run
    np.testing.assert_allclose(jout, tout, **CLOSE)
    assert sorted(jgrads) == sorted(tgrads)
    for name, g in jgrads.items():
        np.testing.assert_allclose(g, tgrads[name], **CLOSE, err_msg=name)
    for name, value in jstate.items():  # torch's num_batches_tracked has no JAX twin
        np.testing.assert_allclose(value, tstate[name], **CLOSE, err_msg=name)


@settings(max_examples=3)  # each example runs both frameworks: about 3 s here
@given(
    recipe=recipes,
    n=st.integers(1, 3),
    seeds=st.tuples(st.integers(0, 2**32), st.integers(0, 2**32)),
    torch_first=st.booleans(),
)
def test_every_member_crosses_frameworks_with_its_outputs_and_gradients(
    recipe, n, seeds, torch_first
):
    """drop_members under one framework, to_members under the other: per member, the same
    outputs, gradients and BatchNorm updates in training (float64)."""
    craft = RecipeNet(recipe)
    x, y = _data(recipe, n, seeds[0] % 1000)
    tb = torch_batching.BatchModule(
        dualtrain_torch.realize(craft, dtype="float64"),
        n,
        seed=seeds[0],
        strategy="vmap",
        check_isolation=False,
    )
    with jax.enable_x64(True), tempfile.TemporaryDirectory() as folder:
        tm = TimeMachine(save_path=folder)
        jb = jax_batching.BatchModule(
            dualtrain_jax.realize(craft, dtype="float64"),
            n,
            seed=seeds[1],
            strategy="vmap",
            check_isolation=False,
        )
        if torch_first:  # trained under torch, carried to JAX
            _torch_step(tb, x, y, n)
            restored = tm.to_members(jb, tm.drop_members(tb, step=1))
        else:  # JAX's members (other weights than torch's), carried to torch
            jb = jb.replace(state={k: v + 0.5 for k, v in jb.state.items()})
            restored = tm.to_members(tb, tm.drop_members(jb, step=1))
        assert [r.step for r in restored] == [1] * n
        assert all(r == [] for r in restored)  # nothing skipped: every member whole
        _assert_runs_agree(_torch_run(tb, x, y, n), _jax_run(jb, x, y, n))


@settings(max_examples=4)
@given(recipe=recipes, n=st.integers(1, 3), seed=st.integers(0, 2**32), data=st.data())
def test_a_member_dropped_from_torch_is_a_single_model_in_either_framework(recipe, n, seed, data):
    """Member i's anchor loads into a torch realize, a JAX realize and member j of a JAX
    BatchModule, and each gives member i's outputs (float64, eval and train mode)."""
    craft = RecipeNet(recipe)
    i = data.draw(st.integers(-n, n - 1), label="member")
    x, y = _data(recipe, n, seed % 1000)
    tb = torch_batching.BatchModule(
        dualtrain_torch.realize(craft, dtype="float64"),
        n,
        seed=seed,
        strategy="vmap",
        check_isolation=False,
    )
    _torch_step(tb, x, y, n)
    tb.eval()
    with torch.no_grad():
        expected = tb(torch.as_tensor(x)).numpy()[i]
    with jax.enable_x64(True), tempfile.TemporaryDirectory() as folder:
        tm = TimeMachine(save_path=folder)
        anchor = tm.drop(tb, member=i)
        single_t = dualtrain_torch.realize(craft, seed=seed + 1, dtype="float64").eval()
        tm.to(single_t, anchor, frozen=True)
        with torch.no_grad():
            np.testing.assert_allclose(single_t(torch.as_tensor(x[i])).numpy(), expected, **CLOSE)
        single_j = dualtrain_jax.realize(craft, seed=seed + 2, dtype="float64")
        tm.to(single_j, anchor, frozen=True)
        np.testing.assert_allclose(np.asarray(single_j(jnp.asarray(x[i]))), expected, **CLOSE)
        jb = jax_batching.BatchModule(
            dualtrain_jax.realize(craft, dtype="float64"),
            n,
            seed=seed + 3,
            strategy="vmap",
            check_isolation=False,
        )
        other = (i + 1) % n  # another member (when there is one): untouched by the load
        before = jb.extract(other)
        tm.to(jb, anchor, member=i)
        out, _ = jb.apply(jb.params, jb.state, jnp.asarray(x), train=False)
        np.testing.assert_allclose(np.asarray(out)[i], expected, **CLOSE)
        if n > 1:
            after = jb.extract(other)
            for k, v in before.params.items():
                np.testing.assert_array_equal(np.asarray(after.params[k]), np.asarray(v))
        # Training mode: the member's BatchNorm uses batch statistics and moves its own.
        tb.train(True)
        t_out = tb(torch.as_tensor(x)).detach().numpy()[i]
        j_one = jb.extract(i)
        j_out, _ = j_one.apply(j_one.params, j_one.state, jnp.asarray(x[i]), train=True)
        np.testing.assert_allclose(np.asarray(j_out), t_out, **CLOSE)
