"""JAX BatchModule: the batched members behave as N separate models (laws), and refusals."""

# ruff: noqa: E501 (the refusal table keeps one case per line)

from __future__ import annotations

import functools

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
from dualtrain_jax.batching import (  # noqa: E402  # noqa: E402
    BatchModule,
    batch_loss,
    batch_topk,
    probe as batching_probe,
    run as batching_run,
)
from dualtrain_jax.batching.loss import cross_entropy  # noqa: E402
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


def test_auto_decides_outside_a_trace_by_rule_and_caches():
    """An MLP: vmap by rule (nothing compiled, not timed), isolation passed from the trace,
    the decision cached for a second module of the same key."""
    CACHE.clear()
    craft = RecipeNet(Recipe("mlp", 3, 4, 2, norm=False, dropout=False))
    bm = BatchModule(dualtrain_jax.realize(craft), 3)
    x = jnp.ones((3, 2, 3))
    traced = jax.jit(lambda m, x: m(x))(bm, x)  # under a trace: vmap, not decided
    assert "not chosen yet" in bm.explain()
    text = bm.tune(x)
    assert "strategy: vmap (rule)" in text and "not timed" in text
    assert "passed without a run" in text
    np.testing.assert_allclose(bm(x), traced, rtol=1e-6)
    again = BatchModule(dualtrain_jax.realize(craft), 3)
    again(x)
    assert "(cached, rule)" in again.explain()


def test_the_rule_compiles_no_candidate_and_runs_no_probe(monkeypatch):
    """No conv made grouped, only JAX's own primitives: vmap is chosen and the members'
    isolation passed without compiling a candidate or the probe."""
    CACHE.clear()

    def refuse(*args, **kwargs):
        raise AssertionError("compiled a candidate or ran the probe")

    monkeypatch.setattr(batching_run.Candidate, "compile", refuse)
    monkeypatch.setattr(batching_probe, "probe", refuse)
    craft = RecipeNet(Recipe("cnn", 4, 3, 2, norm=True, dropout=False))
    bm = BatchModule(dualtrain_jax.realize(craft), 3, shared_input=True)
    bm.tune(jnp.ones((2, 1, 4, 4)))  # a shared input: vmap's conv is one conv, not grouped
    assert bm._core.decision.strategy == "vmap" and bm._core.decision.reason == "rule"


def test_inspect_finds_the_convs_vmap_groups_and_foreign_primitives():
    craft = RecipeNet(Recipe("cnn", 4, 3, 2, norm=False, dropout=False))
    bm = BatchModule(dualtrain_jax.realize(craft), 3, check_isolation=False)
    x = jnp.ones((3, 2, 1, 4, 4))
    found = batching_probe.inspect(
        batching_run.Run(bm._spec.one, "loop", None, bm.params, bm.state, [x], False, None, False)
    )
    assert found.regrouped >= 2 and found.group == 3 and found.foreign == ()
    mlp = BatchModule(dualtrain_jax.realize(RecipeNet(Recipe("mlp", 3, 4, 2, False, False))), 3)
    found = batching_probe.inspect(
        batching_run.Run(
            mlp._spec.one, "loop", None, mlp.params, {}, [jnp.ones((3, 2, 3))], False, None, False
        )
    )
    assert found.regrouped == 0 and found.foreign == ()

    def apply(p, x):
        return (
            jax.pure_callback(
                np.tanh, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="sequential"
            )
            @ p["w"]
        )

    pair = BatchModule(({"w": jnp.ones((3, 2))}, apply), 2, init="identical")
    found = batching_probe.inspect(
        batching_run.Run(
            pair._spec.one, "loop", None, pair.params, {}, [jnp.ones((2, 4, 3))], False, None, False
        )
    )
    assert found.foreign == ("pure_callback",)


class FakeClock:
    """Seconds that move only when a fake candidate compiles or runs."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeCandidate:
    def __init__(self, clock, compile_s, call_s, log, name):
        self.clock, self.compile_s, self.call_s, self.log, self.name = (
            clock,
            compile_s,
            call_s,
            log,
            name,
        )

    def compile(self):
        if self.compile_s is None:
            raise RuntimeError(f"{self.name} cannot be batched")
        self.clock.now += self.compile_s
        self.log.append(("compile", self.name))

    def __call__(self):
        self.clock.now += self.call_s
        self.log.append(("call", self.name))


def fake_make(clock, costs, log, batch):
    """``make(name, members)``: calls linear in the members; compiles as declared for 2
    members, the loop's growing with the members (it compiles each member's program)."""

    def make(name, members):
        compile_s, call_s = costs[name]
        if name == "loop" and compile_s is not None:
            compile_s *= members / 2
        return FakeCandidate(clock, compile_s, call_s * members / batch, log, name)

    return make


def test_a_short_job_times_only_the_first_candidate():
    """A step of 1 ms on all members: 150 of them are 0.15 s, 10% of that 15 ms, less than
    the 0.5 s a compile costs, so after the first candidate nothing more is timed."""
    clock, log = FakeClock(), []
    costs = {"loop": (0.5, 1e-3), "vmap": (0.5, 1e-4), "map": (0.5, 2e-3)}
    out = batching_run.within_budget(
        fake_make(clock, costs, log, 16), ["loop", "vmap", "map"], 16, clock=clock
    )
    assert list(out.trials) == ["loop"] and set(out.skipped) == {"vmap", "map"}
    # a second call, cheap next to the compile, is taken (a first call carries one-time
    # costs); a third would not fit
    assert log.count(("call", "loop")) == 2
    assert "more than the 0.00 s left of the budget" in out.skipped["vmap"]
    assert out.best == "loop" and out.spent == pytest.approx(0.5 + 2e-3 / 8)


def test_a_long_job_times_every_candidate_and_chooses_the_fastest():
    """A conv step of seconds: the budget (10% of 150 steps) pays for every compile; a
    candidate far slower than the best is called once; the fastest per step is chosen."""
    clock, log = FakeClock(), []
    costs = {"loop": (3.0, 1.2), "vmap": (3.5, 3.2), "map": (3.0, 6.0)}
    out = batching_run.within_budget(
        fake_make(clock, costs, log, 16), ["loop", "vmap", "map"], 16, clock=clock
    )
    assert set(out.trials) == {"loop", "vmap", "map"} and not out.skipped
    assert out.best == "loop" and out.budget == pytest.approx(0.1 * 150 * 1.2)
    assert log.count(("call", "loop")) == 3 and log.count(("call", "vmap")) == 1
    assert out.trials["vmap"].step(16) == pytest.approx(3.2)
    assert out.spent < out.budget


def test_close_candidates_are_timed_again_on_all_members_when_it_fits():
    clock, log = FakeClock(), []
    costs = {"loop": (1.0, 1.0), "vmap": (1.0, 0.9)}
    out = batching_run.within_budget(
        fake_make(clock, costs, log, 4), ["loop", "vmap"], 4, clock=clock
    )
    assert out.best == "vmap" and {t.members for t in out.trials.values()} == {4}
    clock, log = FakeClock(), []
    costs = {"loop": (6.0, 2.0), "vmap": (6.0, 1.9), "map": (6.0, 20.0)}  # no room to confirm
    out = batching_run.within_budget(
        fake_make(clock, costs, log, 64), ["loop", "vmap", "map"], 64, clock=clock
    )
    assert out.best == "vmap" and {t.members for t in out.trials.values()} == {2}
    assert "not timed on all 64 members" in out.skipped["loop"]


def test_the_loops_compile_grows_with_the_members_and_counts():
    """The loop compiles one program per member: on 64 members, 150 steps 1% faster do not
    pay for compiling 32 times what map compiles."""
    clock, log = FakeClock(), []
    costs = {"loop": (2.0, 1.0), "map": (2.0, 1.01)}
    out = batching_run.within_budget(
        fake_make(clock, costs, log, 64), ["loop", "map"], 64, clock=clock
    )
    assert out.trials["loop"].compile_all(64) == pytest.approx(64.0)
    assert out.best == "map"


def test_a_candidate_that_raises_is_reported_and_the_others_still_decide():
    clock, log = FakeClock(), []
    costs = {"loop": (1.0, 2.0), "vmap": (None, 0.0), "map": (1.0, 4.0)}
    out = batching_run.within_budget(
        fake_make(clock, costs, log, 8), ["vmap", "loop", "map"], 8, clock=clock
    )
    assert "cannot be batched" in str(out.errors["vmap"]) and out.best == "loop"
    clock = FakeClock()
    out = batching_run.within_budget(
        fake_make(clock, {"vmap": (None, 0.0)}, [], 8), ["vmap"], 8, clock=clock
    )
    assert out.best is None and out.trials == {}


@settings(max_examples=40, deadline=None)
@given(
    compiles=st.lists(st.floats(0.01, 20.0), min_size=3, max_size=3),
    calls=st.lists(st.floats(1e-5, 10.0), min_size=3, max_size=3),
    batch=st.integers(1, 64),
)
def test_the_decision_spends_at_most_its_budget_beyond_the_first_candidate(compiles, calls, batch):
    """Law: the chosen strategy is the cheapest timed (150 steps and the compile, on all
    members); every
    candidate is timed, skipped or failed; after the first candidate, a candidate starts
    only while the time spent is within the budget (10% of 150 steps of the best then),
    so the whole spend is at most the first candidate's, the largest budget and one more
    candidate's cost (each fake call is linear in the members, as the estimate assumes)."""
    names = ["loop", "vmap", "map"]
    clock, log = FakeClock(), []
    costs = dict(zip(names, zip(compiles, calls, strict=True), strict=True))
    out = batching_run.within_budget(fake_make(clock, costs, log, batch), names, batch, clock=clock)
    jobs = {n: t.job(batch, 150) for n, t in out.trials.items()}
    assert out.best == min(jobs, key=lambda n: jobs[n])
    assert set(names) <= set(out.trials) | set(out.skipped) | set(out.errors)
    first = compiles[0] + 3 * calls[0]
    biggest = max(c * batch + 3 * t for c, t in zip(compiles, calls, strict=True))
    assert out.spent <= first + 0.1 * 150 * calls[0] + 2 * biggest + 1e-9


def test_vmap_losing_to_the_loop_is_explained_with_the_numbers(monkeypatch):
    """A CNN with per-member inputs: vmap groups its convs, so the candidates are timed
    (here with a fake clock: vmap 3x the loop's time); explain() gives each candidate's
    time, compile and why vmap lost, and the decision's cost against its budget."""
    CACHE.clear()
    clock, log = FakeClock(), []
    costs = {"loop": (2.0, 1.0), "vmap": (2.0, 3.0), "map": (2.0, 2.0)}

    def candidates(run, options):
        return fake_make(clock, costs, log, 4)

    monkeypatch.setattr(batching_run, "candidates", candidates)
    monkeypatch.setattr(
        batching_run, "within_budget", functools.partial(batching_run.within_budget, clock=clock)
    )
    craft = RecipeNet(Recipe("cnn", 4, 3, 2, norm=False, dropout=False))
    bm = BatchModule(dualtrain_jax.realize(craft), 4)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 2, 1, 4, 4)), jnp.float32)
    text = bm.tune(x)
    assert "strategy: loop (measured)" in text
    assert "vmap" in text and "3.00x loop's time" in text and "grouped convs" in text
    assert "compiled in 2.00 s" in text and "budget" in text
    assert "passed without a run" in text
    with jax.enable_x64(False):
        np.testing.assert_allclose(
            bm(x),
            BatchModule(dualtrain_jax.realize(craft), 4, strategy="vmap")(x),
            rtol=1e-5,
            atol=1e-6,
        )


def test_a_leaking_callback_is_probed_under_auto():
    """A host callback is foreign to the trace: "auto" probes the strategy it chose (vmap by
    rule here), and the leak is caught."""
    CACHE.clear()
    seen = []

    def remember(x):
        seen.append(float(np.sum(x)))
        return np.asarray(x + sum(seen[:-1]), dtype=np.float32)

    @jax.custom_jvp
    def leak(y):
        return jax.pure_callback(
            remember, jax.ShapeDtypeStruct(y.shape, y.dtype), y, vmap_method="sequential"
        )

    @leak.defjvp
    def leak_jvp(primals, tangents):
        return leak(primals[0]), tangents[0]

    bm = BatchModule(({"w": jnp.ones((3, 2))}, lambda p, x: leak(x @ p["w"])), 2, init="identical")
    with pytest.raises(IsolationError, match=r"strategy 'vmap'"):
        bm(jnp.ones((2, 4, 3)))


@settings(max_examples=3, deadline=None)
@given(recipe=recipes, n=st.integers(2, 3), seed=st.integers(0, 99), shared=st.booleans())
def test_the_strategy_auto_chooses_gives_vmaps_results(recipe, n, seed, shared):
    """Whatever "auto" picks (rule or timing), outputs and gradients are vmap's (float64)."""
    CACHE.clear()
    with jax.enable_x64(True):
        module = dualtrain_jax.realize(RecipeNet(recipe), dtype="float64")
        x, _ = _data(recipe, n, 2, seed)
        x = x[0] if shared else x
        results = []
        for strategy in ("auto", "vmap"):
            bm = BatchModule(module, n, seed=seed, shared_input=shared, strategy=strategy)
            if strategy == "auto":
                bm.tune(x)

            def total(params, bm=bm):
                out, _ = bm.apply(params, bm.state, x)
                return jnp.sum(out * out), out

            (_, out), grads = jax.jit(jax.value_and_grad(total, has_aux=True))(bm.params)
            results.append((out, grads))
        np.testing.assert_allclose(results[0][0], results[1][0], **TIGHT)
        for k in results[0][1]:
            np.testing.assert_allclose(results[0][1][k], results[1][1][k], **TIGHT)


def test_a_memory_budget_runs_the_members_in_chunks():
    craft = RecipeNet(Recipe("mlp", 3, 4, 2, norm=False, dropout=False))
    module = dualtrain_jax.realize(craft)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((6, 2, 3)), jnp.float32)
    whole = BatchModule(module, 6, strategy="vmap")
    need = whole.params["first.weight"][0].size * 4 * 4
    tight = BatchModule(module, 6, strategy="vmap", memory_budget=need * 2)
    np.testing.assert_allclose(tight(x), whole(x), rtol=1e-6)
    assert tight._core.decision.strategy == "map" and tight._core.decision.chunk < 6
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


def test_a_call_outside_a_trace_runs_one_compiled_program():
    """Outside jit, apply runs the members as one jitted program (each eager op would
    compile on its own), equal to the traced call; the program is compiled once."""
    from dualtrain_jax.batching import module as jax_batching

    def init(key):
        return {"w": jax.random.normal(key, (3, 2)), "b": jnp.zeros(2)}

    def apply(p, x):
        return jax.nn.relu(x @ p["w"] + p["b"])

    bm = BatchModule((init, apply), 4, shared_input=True, strategy="vmap")
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    eager, _ = bm.apply(bm.params, bm.state, x)
    traced, _ = jax.jit(lambda p, s, x: bm.apply(p, s, x))(bm.params, bm.state, x)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(traced), rtol=1e-6, atol=1e-6)
    run = jax_batching._eager(bm._spec.one, "vmap", None)
    before = run._cache_size()
    bm.apply(bm.params, bm.state, x + 1)
    assert run._cache_size() == before == 1
    # A Python number among the inputs is not an array: the call runs as before.
    assert not jax_batching._concrete((bm.params, 1.0))
