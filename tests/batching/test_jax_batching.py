"""JAX BatchModule: the batched members behave as N separate models (laws), and refusals."""

# ruff: noqa: E501 (the refusal table keeps one case per line)

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

import dualtrain_jax  # noqa: E402
from dualtrain.batching import CACHE, member_seeds  # noqa: E402
from dualtrain.errors import ArgumentError, IsolationError, ShapeError  # noqa: E402
from dualtrain_jax import Rudder  # noqa: E402
from dualtrain_jax.batching import BatchModule, batch_loss, batch_topk  # noqa: E402
from dualtrain_jax.batching_loss import cross_entropy  # noqa: E402
from tests.batching.builders import Recipe, RecipeNet, recipes  # noqa: E402

STRATEGIES = ("vmap", "map", "loop")
TIGHT = {"rtol": 1e-10, "atol": 1e-12}
STEPPED = {"rtol": 1e-7, "atol": 1e-9}  # Adam magnifies rounding where a gradient is ~0


def _data(recipe, n, b, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, b, *recipe.input_shape()))
    y = rng.integers(0, recipe.classes, (n, b))
    return jnp.asarray(x), jnp.asarray(y, jnp.int32)


@settings(max_examples=3)  # each example compiles four functions: about 3 s here
@given(
    recipe=recipes,
    n=st.integers(1, 3),
    strategy=st.sampled_from(STRATEGIES),
    optimizer=st.sampled_from(["sgd", "adam"]),
    seed=st.integers(0, 2**16),
)
def test_training_equals_a_loop_over_separate_models(recipe, n, strategy, optimizer, seed):
    """Forward, per-member loss, gradients, state and K optax steps of the stacked params
    are those of N separately realized models stepped one by one (float64)."""
    with jax.enable_x64(True):
        craft = RecipeNet(recipe)
        bm = BatchModule(
            dualtrain_jax.realize(craft, dtype="float64"),
            n,
            seed=seed,
            strategy=strategy,
            check_isolation=False,
        )
        models = [dualtrain_jax.realize(craft, seed=s, dtype="float64") for s in bm.seeds]
        tx = {"sgd": optax.sgd(0.1, momentum=0.9), "adam": optax.adam(0.01)}[optimizer]

        @jax.jit
        def batched(params, state, x, y):
            def loss(params):
                out, new_state = bm.apply(params, state, x, train=True)
                return batch_loss(out, y, n).sum(), (out, new_state)

            return jax.value_and_grad(loss, has_aux=True)(params)[::-1]

        @jax.jit
        def separate(params, state, x, y):  # one compilation for every member
            def loss(params):
                out, new_state = models[0].apply(params, state, x, train=True)
                return cross_entropy(out, y).mean(), (out, new_state)

            return jax.value_and_grad(loss, has_aux=True)(params)[::-1]

        update = jax.jit(tx.update)
        opt = tx.init(bm.params)
        opts = [tx.init(m.params) for m in models]
        for step in range(2):
            x, y = _data(recipe, n, 3, seed + step)
            grads, (_, (out, new_state)) = batched(bm.params, bm.state, x, y)
            tol = TIGHT if step == 0 else STEPPED
            for i, m in enumerate(models):
                g, (_, (o, s)) = separate(m.params, m.state, x[i], y[i])
                np.testing.assert_allclose(out[i], o, **tol)
                for k in g:
                    np.testing.assert_allclose(grads[k][i], g[k], **tol)
                for k in s:
                    np.testing.assert_allclose(new_state[k][i], s[k], **tol)
                updates, opts[i] = update(g, opts[i], m.params)
                m.params, m.state = optax.apply_updates(m.params, updates), s
            updates, opt = update(grads, opt, bm.params)
            bm.params, bm.state = optax.apply_updates(bm.params, updates), new_state
        for i, m in enumerate(models):
            member = bm.extract(i)
            for k in m.params:
                np.testing.assert_allclose(member.params[k], m.params[k], **STEPPED)


@settings(max_examples=3)
@given(recipe=recipes, n=st.integers(2, 4), seed=st.integers(0, 99), shared=st.booleans())
def test_every_strategy_gives_the_same_outputs_and_gradients(recipe, n, seed, shared):
    with jax.enable_x64(True):
        module = dualtrain_jax.realize(RecipeNet(recipe), dtype="float64")
        x, _ = _data(recipe, n, 2, seed)
        x = x[0] if shared else x
        results = []
        for strategy in STRATEGIES:
            bm = BatchModule(module, n, seed=seed, shared_input=shared, strategy=strategy)

            def total(params, bm=bm):
                out, _ = bm.apply(params, bm.state, x)
                return jnp.sum(out * out), out

            (_, out), grads = jax.jit(jax.value_and_grad(total, has_aux=True))(bm.params)
            results.append((out, grads))
        for out, grads in results[1:]:
            np.testing.assert_allclose(out, results[0][0], **TIGHT)
            for k in grads:
                np.testing.assert_allclose(grads[k], results[0][1][k], **TIGHT)


@settings(max_examples=4)
@given(recipe=recipes, n=st.integers(1, 3), index=st.integers(-3, 2), seed=st.integers(0, 99))
def test_extract_of_insert_is_the_module_inserted(recipe, n, index, seed):
    craft = RecipeNet(recipe)
    bm = BatchModule(dualtrain_jax.realize(craft), n, seed=seed, check_isolation=False)
    other = dualtrain_jax.realize(craft, seed=seed + 1)
    other.state = {k: v + 1.0 for k, v in other.state.items()}
    before = [bm.extract(j) for j in range(n)]
    i = index % n
    bm.insert(index if -n <= index < n else i, other)
    for j in range(n):
        got, want = bm.extract(j), (other if j == i else before[j])
        for k in want.params:
            np.testing.assert_array_equal(got.params[k], want.params[k])
        for k in want.state:
            np.testing.assert_array_equal(got.state[k], want.state[k])
    assert isinstance(got, dualtrain_jax.craft.JaxModule)
    stacked = BatchModule.from_modules([other, before[0]], check_isolation=False)
    np.testing.assert_array_equal(stacked.params["first.weight"][0], other.params["first.weight"])


def test_independent_members_are_realize_with_the_member_seeds():
    craft = RecipeNet(Recipe("cnn", 3, 2, 3, norm=True, dropout=False))
    bm = BatchModule(dualtrain_jax.realize(craft), 3, seed=11)
    assert bm.seeds == member_seeds(11, 3)
    for i, s in enumerate(bm.seeds):
        want = dualtrain_jax.realize(craft, seed=s)
        for k in want.params:
            np.testing.assert_array_equal(bm.params[k][i], want.params[k])
    same = BatchModule(dualtrain_jax.realize(craft, seed=4), 2, init="identical")
    np.testing.assert_array_equal(same.params["last.weight"][1], same.params["last.weight"][0])


def test_a_params_apply_pair_and_an_init_apply_pair():
    def init(key):
        return {"w": jax.random.normal(key, (3, 2)), "b": jnp.zeros(2)}

    def apply(p, x):
        return x @ p["w"] + p["b"]

    drawn = BatchModule((init, apply), 4, seed=3, strategy="vmap", check_isolation=False)
    assert drawn.params["w"].shape == (4, 3, 2)
    assert not np.array_equal(drawn.params["w"][0], drawn.params["w"][1])
    x = jnp.ones((4, 5, 3))
    out = drawn(x)
    params, fn = drawn.extract(2)
    np.testing.assert_allclose(out[2], fn(params, x[2]), rtol=1e-6)
    fixed = BatchModule((init(jax.random.PRNGKey(0)), apply), 2, init="identical", strategy="vmap")
    assert fixed(jnp.ones((2, 1, 3))).shape == (2, 1, 2)
    with pytest.raises(ArgumentError, match=r"init must be 'identical' for a \(params, apply_fn\)"):
        BatchModule((init(jax.random.PRNGKey(0)), apply), 2)


def test_the_module_is_a_pytree_for_jit_and_grad_and_dropout_differs_per_member():
    class Drop(RecipeNet):
        def __init__(self):
            super().__init__(Recipe("mlp", 3, 4, 4, norm=True, dropout=False))
            self.drop = dock_dropout()

        def run(self, x):
            return self.drop(super().run(x))

    bm = BatchModule(
        dualtrain_jax.realize(Drop()), 3, shared_input=True, strategy="vmap", check_isolation=False
    )
    leaves = jax.tree_util.tree_leaves(bm)
    assert len(leaves) == len(bm.params) + len(bm.state)
    x = jnp.ones((16, 3))
    with Rudder(bm):
        out = jax.jit(lambda m, x, k: m(x, rng=k))(bm, x, jax.random.PRNGKey(0))
    zeros = np.asarray(out) == 0
    assert not np.array_equal(zeros[0], zeros[1])
    grads = jax.jit(jax.grad(lambda m: jnp.sum(m.apply(m.params, m.state, x)[0])))(bm)
    assert isinstance(grads, BatchModule) and grads.params["last.weight"].shape == (3, 4, 4)


def dock_dropout():
    from dualtrain import dock

    return dock.Dropout(0.5)


def test_batchnorm_statistics_are_per_member():
    craft = RecipeNet(Recipe("mlp", 3, 4, 2, norm=True, dropout=False))
    bm = BatchModule(dualtrain_jax.realize(craft), 3, init="identical", strategy="map")
    x = np.random.default_rng(0).standard_normal((3, 8, 3)).astype(np.float32)
    x[1] += 5.0
    with Rudder(bm):
        bm(jnp.asarray(x))
    means = np.asarray(bm.state["norm.running_mean"])
    assert not np.allclose(means[0], means[1]) and not np.allclose(means[0], means[2])
    w, b = bm.params["first.weight"][0], bm.params["first.bias"][0]
    np.testing.assert_allclose(means[1], 0.1 * (x[1] @ np.asarray(w).T + b).mean(0), rtol=1e-5)


def test_auto_measures_outside_a_trace_and_caches():
    CACHE.clear()
    craft = RecipeNet(Recipe("mlp", 3, 4, 2, norm=False, dropout=False))
    bm = BatchModule(dualtrain_jax.realize(craft), 3)
    x = jnp.ones((3, 2, 3))
    traced = jax.jit(lambda m, x: m(x))(bm, x)  # under a trace: vmap, not measured
    assert "not chosen yet" in bm.explain()
    text = bm.tune(x)
    assert "(measured)" in text and "<- chosen" in text and "passed" in text
    np.testing.assert_allclose(bm(x), traced, rtol=1e-6)
    again = BatchModule(dualtrain_jax.realize(craft), 3)
    again(x)
    assert "(cached)" in again.explain()


def test_a_memory_budget_runs_the_members_in_chunks():
    craft = RecipeNet(Recipe("mlp", 3, 4, 2, norm=False, dropout=False))
    module = dualtrain_jax.realize(craft)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((6, 2, 3)), jnp.float32)
    whole = BatchModule(module, 6, strategy="vmap")
    need = whole.params["first.weight"][0].size * 4 * 4
    tight = BatchModule(module, 6, strategy="vmap", memory_budget=need * 2)
    np.testing.assert_allclose(tight(x), whole(x), rtol=1e-6)
    assert tight._spec.decision.strategy == "map" and tight._spec.decision.chunk < 6
    with pytest.raises(ArgumentError, match="memory_budget must hold at least one member"):
        BatchModule(module, 6, memory_budget=1)(x)
    traced = BatchModule(module, 6, memory_budget=need * 2)  # auto, first call under jit
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(traced, x), whole(x), rtol=1e-6)


def test_a_host_callback_that_mixes_members_is_refused():
    seen = []

    def remember(x):
        seen.append(float(np.sum(x)))
        return np.asarray(x + sum(seen[:-1]), dtype=np.float32)  # every earlier call leaks in

    @jax.custom_jvp
    def leak(y):
        return jax.pure_callback(remember, jax.ShapeDtypeStruct(y.shape, y.dtype), y)

    @leak.defjvp
    def leak_jvp(primals, tangents):  # callbacks have no derivative of their own
        return leak(primals[0]), tangents[0]

    def apply(p, x):
        return leak(x @ p["w"])

    pair = ({"w": jnp.ones((3, 2))}, apply)
    bm = BatchModule(pair, 2, init="identical", strategy="loop")
    with pytest.raises(IsolationError, match=r"strategy 'loop'.*apply_fn '.*apply'"):
        bm(jnp.ones((2, 4, 3)))


def test_batch_loss_and_topk_are_per_member():
    out = jnp.asarray([[[3.0, 1.0, 2.0], [0.0, 1.0, 5.0]], [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]])
    y = jnp.asarray([[0, 1], [0, 0]])
    np.testing.assert_allclose(
        batch_topk(out, y, 2, ks=(1, 2, 9)), [[0.5, 0.5], [1.0, 0.5], [1.0, 1.0]]
    )
    np.testing.assert_allclose(batch_topk(out, jnp.asarray([0, 1]), 2, ks=1), [[0.5, 0.0]])
    loss = batch_loss(out, y, 2, reduction="sum")
    logp = jax.nn.log_softmax(out[1], -1)
    np.testing.assert_allclose(loss[1], -(logp[0, 0] + logp[1, 0]), rtol=1e-6)
    assert batch_loss(out, y, 2, reduction="none").shape == (2, 2)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m: BatchModule(m, 0), ArgumentError, r"batch must be a positive int; got batch=0"),
        (lambda m: BatchModule(m, 2, strategy="chunked"), ArgumentError, r"strategy must be one of \('auto', 'vmap', 'map', 'loop'\); got strategy='chunked'"),
        (lambda m: BatchModule(m, 2, init="same"), ArgumentError, r"init must be one of"),
        (lambda m: BatchModule("net", 2), ArgumentError, r"module must be a realized Craft"),
        (lambda m: BatchModule(m, 2)(jnp.ones((3, 4, 3))), ShapeError, r"inputs\[0\] must have the member count as its leading dimension, \[batch, B, ...\] with batch=2; got inputs\[0\] of shape \(3, 4, 3\)"),
        (lambda m: BatchModule(m, 2).extract(-3), ArgumentError, r"index must be an int in \[-2, 1\]"),
        (lambda m: BatchModule.from_modules([m, dualtrain_jax.realize(RecipeNet(Recipe("mlp", 3, 5, 2, False, False)))]), ArgumentError, r"modules\[1\] must have the first member's architecture; first.bias is a float32 parameter of shape \(5,\)"),
        (lambda m: BatchModule.from_modules([]), ArgumentError, r"modules must be a non-empty list"),
        (lambda m: batch_loss(jnp.zeros((3, 2, 4)), jnp.zeros((3, 2), jnp.int32), 2), ShapeError, r"outputs must have the member count"),
        (lambda m: batch_topk(jnp.zeros((2, 2, 4)), jnp.zeros((2, 2), jnp.int32), 2, ks=()), ArgumentError, r"ks must be a non-empty sequence"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_the_argument_the_value_and_what_was_expected(
    call, error, message
):
    module = dualtrain_jax.realize(RecipeNet(Recipe("mlp", 3, 4, 2, False, False)))
    with pytest.raises(error, match=message):
        call(module)
