"""dualtrain_jax.accelerate on functions: the verified ladder JIT_DONATE -> JIT -> EAGER.

A candidate is chosen only when it computes what op-by-op JAX computes; the caller's arrays
survive the trials; traced calls pass through; signatures, the decision cache and runtime
failures are handled as docs/acceleration.md says. Timings are reported, never asserted.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.craft import Craft, dock
from dualtrain.errors import ArgumentError
from tests.accelerate.test_accelerate_ladder import Ticks

jax = pytest.importorskip("jax")
jnp = jax.numpy
from dualtrain_jax.compilation import (  # noqa: E402
    AcceleratedFunction,
    accelerate,
    accelerate_model,
    keys,
    rungs,
)
from tests.helpers import CHILD_TIMEOUT_S  # noqa: E402

# no compile budget: a verdict must not turn on how busy the machine is
# budget=inf: the whole ladder at the first call
# (payback: tests/accelerate/test_accelerate_payback.py)
FAST = {"warm_steps": 1, "cache": False, "compile_budget": 1e9, "budget": math.inf}
ANY_WIN = {**FAST, "min_speedup": 1e-9}  # a verified candidate is always chosen
NO_WIN = {**FAST, "min_speedup": 1e9}  # eager is always chosen
X = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32))


def busy(x):
    """Enough ops that compiling them pays, so JIT's speedup is worth reporting."""
    for i in range(12):
        x = jnp.tanh(x * 1.01 + i * 0.01)
    return x


def sgd_step(params, state, x):
    """A train step of a linear model: returns params and state anew (donatable)."""

    def loss(p):
        return jnp.mean((x @ p["w"] + p["b"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return params, {"count": state["count"] + 1}, value


def fresh_params():
    return (
        {"w": jnp.ones((3, 2)), "b": jnp.zeros((2,))},
        {"count": jnp.zeros((), jnp.int32)},
    )


def attempts(fn, index=0):
    return {a.rung: a for a in fn.explain().decisions[index].attempts}


def test_the_chosen_rung_computes_what_eager_does_and_the_speedup_is_reported():
    fast = accelerate(busy, backends=("JIT", "EAGER"), **FAST)
    got = fast(X)
    with jax.disable_jit():
        want = busy(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    jit = attempts(fast)["JIT"]
    assert jit.speedup is not None and jit.step_ms is not None and jit.compile_s is not None
    text = str(fast.explain())
    assert "x eager" in text and "EAGER" in text and "exact: no approximation" in text


@settings(max_examples=8)
@given(shift=st.floats(1e-2, 10.0), rows=st.integers(1, 5))
def test_a_wrong_candidate_is_never_chosen(shift, rows):
    """Traced, this function adds `shift`: JIT and JIT_DONATE are wrong; eager is chosen."""

    def sly(x):
        return x + shift if isinstance(x, jax.core.Tracer) else x

    x = jnp.ones((rows, 3))
    fast = accelerate(sly, **ANY_WIN)
    np.testing.assert_array_equal(np.asarray(fast(x)), np.ones((rows, 3)))
    decision = fast.explain().decisions[0]
    assert decision.chosen == "EAGER"
    for rung in ("JIT", "JIT_DONATE"):
        assert attempts(fast)[rung].status == "rejected"
        assert "differs from eager" in attempts(fast)[rung].reason


def test_a_failing_candidate_is_never_chosen():
    def branchy(x):  # Python control flow on a value: fails to trace, fine op by op
        return x * 2 if float(x.sum()) > 0 else -x

    fast = accelerate(branchy, **ANY_WIN)
    np.testing.assert_array_equal(np.asarray(fast(X * 0 + 1)), np.full((4, 3), 2.0))
    assert fast.explain().chosen("call") == "EAGER"
    assert attempts(fast)["JIT"].status == "failed"
    assert "Error" in attempts(fast)["JIT"].reason


def test_trials_never_donate_the_callers_arrays():
    params, state = fresh_params()
    fast = accelerate(sgd_step, **NO_WIN)  # JIT_DONATE is tried (verified), eager serves
    _, new_state, _ = fast(params, state, X)
    assert attempts(fast)["JIT_DONATE"].status == "rejected"  # verified, but "not faster"
    assert attempts(fast)["JIT_DONATE"].max_error is not None
    assert not any(a.is_deleted() for a in jax.tree_util.tree_leaves((params, state, X)))
    assert int(new_state["count"]) == 1


def test_a_chosen_jit_donate_donates_what_the_step_returns_anew():
    params, state = fresh_params()
    with jax.disable_jit():
        want = sgd_step(params, state, X)
    fast = accelerate(sgd_step, backends=("JIT_DONATE",), **ANY_WIN)
    got = fast(params, state, X)  # the trials ran on copies: the deciding call still works
    assert fast.explain().chosen("call") == "JIT_DONATE"
    assert "donates positional arguments [0, 1]" in attempts(fast)["JIT_DONATE"].reason
    assert all(a.is_deleted() for a in jax.tree_util.tree_leaves((params, state)))
    assert not X.is_deleted()
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    again = fast(*got[:2], X)  # a loop feeds the outputs back in
    assert int(again[1]["count"]) == 2


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("decisions")


@settings(max_examples=5)
@given(seed=st.integers(0, 2**16), steps=st.integers(1, 4))
def test_k_accelerated_steps_equal_k_eager_steps_and_k_plain_jit_steps(seed, steps, shared_cache):
    data = np.random.default_rng(seed).normal(size=(steps, 4, 3)).astype(np.float32)
    fast = accelerate(sgd_step, **{**ANY_WIN, "cache": shared_cache})
    plain = jax.jit(sgd_step)
    got, eager, compiled = fresh_params(), fresh_params(), fresh_params()
    for x in data:
        *got, _ = fast(*got, jnp.asarray(x))  # JIT_DONATE may consume `got`: rebind it
        with jax.disable_jit():
            *eager, _ = sgd_step(*eager, jnp.asarray(x))
        *compiled, _ = plain(*compiled, jnp.asarray(x))
    assert fast.explain().chosen("call") in ("JIT", "JIT_DONATE")
    for want in (eager, compiled):
        for g, w in zip(
            jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True
        ):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    assert int(got[1]["count"]) == steps


def test_jit_donate_with_nothing_to_donate_is_unavailable():
    fast = accelerate(lambda w, x: x @ w, **FAST)
    fast(jnp.ones((3, 2)), X)
    assert attempts(fast)["JIT_DONATE"].status == "unavailable"
    assert "nothing to donate" in attempts(fast)["JIT_DONATE"].reason


@st.composite
def calls(draw):
    shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    dtype = draw(st.sampled_from(["float32", "int32", "bool"]))
    kind = draw(st.sampled_from(["jax", "numpy", "number", "fixed"]))
    if kind == "jax":
        leaf = jnp.zeros(shape, dtype)
    elif kind == "numpy":
        leaf = np.zeros(shape, dtype)
    elif kind == "number":
        leaf = draw(st.sampled_from([1, 2.5, True]))
    else:
        leaf = draw(st.sampled_from(["relu", "gelu", frozenset({1})]))
    return draw(st.sampled_from(["bare", "dict", "list"])), leaf


def _wrap(how, leaf):
    return {"bare": leaf, "dict": {"k": leaf}, "list": [leaf, 0.5]}[how]


@given(a=calls(), b=calls())
def test_two_calls_share_a_signature_exactly_when_jit_would_reuse_a_trace(a, b):
    """Same structure, shapes, dtypes, weak types, placement, number types, fixed values."""
    ta, tb = ((_wrap(*a),), {}), ((_wrap(*b),), {})
    ka, kb = keys.call_key(ta), keys.call_key(tb)

    def identity(call):
        how, leaf = call
        if isinstance(leaf, (jax.Array, np.ndarray)):
            return how, type(leaf) is np.ndarray, leaf.shape, str(leaf.dtype)
        return how, type(leaf), leaf if not isinstance(leaf, (int, float)) else None

    assert (ka[0] == kb[0]) == (identity(a) == identity(b))
    la = keys.Layout.of(*ka, ta[0])
    lb = keys.Layout.of(*kb, tb[0])
    assert (la.signature == lb.signature) == (ka[0] == kb[0])


@settings(max_examples=20)
@given(
    shapes=st.lists(st.sampled_from([(2,), (3,), (2, 2)]), min_size=1, max_size=3),
    returned=st.lists(st.integers(0, 2), max_size=3),
)
def test_donation_takes_each_argument_the_function_returns_anew(shapes, returned):
    """An argument is donated iff an unclaimed output has its structure, shapes and dtypes."""
    args = tuple(jnp.zeros(s) for s in shapes)
    picks = [i for i in returned if i < len(args)]

    def fn(*xs):
        return (*[xs[i] * 2 for i in picks], jnp.float32(0))

    found = keys.call_key((args, {}))
    layout = keys.Layout.of(*found, args)
    argnums, feed = rungs.donation(fn, layout, args, {}, None)
    outputs = [args[i].shape for i in picks] + [()]
    claimed, want = set(), []
    for i, arg in enumerate(args):
        j = next((j for j, s in enumerate(outputs) if s == arg.shape and j not in claimed), None)
        if j is not None:
            claimed.add(j)
            want.append(i)
    assert argnums == tuple(want)
    assert all(outputs[feed[i]] == args[i].shape for i in argnums)


def test_calls_inside_the_callers_transformations_pass_through():
    fast = accelerate(busy, **FAST)
    x = X
    np.testing.assert_allclose(
        np.asarray(jax.jit(fast)(x)), np.asarray(jax.jit(busy)(x)), rtol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(jax.grad(lambda v: fast(v).sum())(x)),
        np.asarray(jax.grad(lambda v: busy(v).sum())(x)),
        rtol=1e-6,
    )
    assert jax.vmap(fast)(x).shape == x.shape
    with jax.disable_jit():
        fast(x)
    assert fast.explain().decisions == []  # nothing was decided: the outer transformation ran


def test_a_new_signature_is_reverified_and_a_shape_dependent_difference_caught():
    def sly(x):  # right for up to 4 rows, wrong beyond, and only when traced
        wrong = isinstance(x, jax.core.Tracer) and x.shape[0] > 4
        return busy(x) + (1.0 if wrong else 0.0)

    fast = accelerate(sly, backends=("JIT", "EAGER"), **ANY_WIN)
    fast(jnp.ones((4, 3)))
    fast(jnp.ones((3, 3)))
    got = fast(jnp.ones((6, 3)))
    with jax.disable_jit():
        want = busy(jnp.ones((6, 3)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    first, second, third = fast.explain().decisions
    assert first.chosen == "JIT" and second.chosen == "JIT" and third.chosen == "EAGER"
    assert "re-verified" in second.attempts[0].reason
    assert "differs here" in third.attempts[0].reason
    assert first.signature != second.signature != third.signature


def test_beyond_max_signatures_calls_run_eager():
    fast = accelerate(busy, backends=("JIT", "EAGER"), max_signatures=2, **ANY_WIN)
    for rows in (1, 2, 3):
        fast(jnp.ones((rows, 3)))
    decisions = fast.explain().decisions
    assert [d.chosen for d in decisions] == ["JIT", "JIT", "EAGER"]
    assert "more than 2 signatures" in decisions[2].attempts[0].reason


def test_a_second_accelerate_reads_the_decision_from_the_cache(tmp_path):
    options = {**ANY_WIN, "backends": ("JIT", "EAGER"), "cache": tmp_path, "warm_steps": 2}
    first = accelerate(busy, **options)
    want = first(X)
    assert not first.explain().decisions[0].from_cache
    assert list(tmp_path.glob("*.json"))
    second = accelerate(busy, **options, clock=Ticks())
    got = second(X)
    decision = second.explain().decisions[0]
    assert decision.from_cache
    assert decision.decide_s == 1.0  # the clock read at the start and the end, nothing timed
    assert decision.chosen == first.explain().decisions[0].chosen
    assert "from the decision cache" in str(second.explain())
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_ladder_times_on_the_clock_it_is_given():
    """Under a clock that moves one second per reading, every step costs one second:
    JIT is verified but not faster, whatever the machine is doing."""
    fast = accelerate(
        busy, backends=("JIT", "EAGER"), warm_steps=3, cache=False, clock=Ticks(), budget=math.inf
    )
    np.testing.assert_allclose(np.asarray(fast(X)), np.asarray(busy(X)), rtol=1e-5)
    jit, eager = attempts(fast)["JIT"], attempts(fast)["EAGER"]
    assert fast.explain().chosen("call") == "EAGER"
    assert jit.status == "rejected" and jit.reason == "verified, but not 1.03x faster than eager"
    # two readings: the build and the first run are timed apart, around eager's check
    assert (jit.compile_s, jit.step_ms, jit.speedup) == (2.0, 1e3, 1.0)
    assert eager.step_ms == 1e3


def test_a_corrupted_cache_file_is_ignored_and_replaced(tmp_path):
    options = {**ANY_WIN, "backends": ("JIT", "EAGER"), "cache": tmp_path}
    accelerate(busy, **options)(X)
    (path,) = tmp_path.glob("*.json")
    path.write_text('{"format": 1, "key": "torn')
    again = accelerate(busy, **options)
    np.testing.assert_allclose(np.asarray(again(X)), np.asarray(busy(X)), rtol=1e-6)
    assert not again.explain().decisions[0].from_cache
    assert json.loads(path.read_text())["decision"]["chosen"] == "JIT"


def breaking_when_armed():
    """`busy` behind a host callback that raises, in compiled code only, once armed."""
    armed = [False]

    def fussy(x):
        if armed[0] and not jax.config.jax_disable_jit:
            raise RuntimeError("the compiled kernel broke")

    def fn(x):
        jax.debug.callback(fussy, x)
        return busy(x)

    return armed, fn


@pytest.mark.parametrize("calls", [1, 40])  # 40: the decision final, calls through the lane
def test_a_runtime_failure_falls_back_to_eager_for_good(calls):
    armed, fn = breaking_when_armed()
    fast = accelerate(fn, backends=("JIT", "EAGER"), **ANY_WIN)
    for _ in range(calls):
        fast(X)
    assert fast.explain().chosen("call") == "JIT"
    armed[0] = True
    np.testing.assert_allclose(np.asarray(fast(X)), np.asarray(busy(X)), rtol=1e-6)
    decision = fast.explain().decisions[0]
    assert decision.chosen == "EAGER"
    assert any("failed at run time" in e for e in decision.events)
    fast(X)  # sticky: eager serves from now on, without another failure
    assert len(decision.events) == 1


def test_the_decorator_bare_and_with_arguments():
    @accelerate_model
    def bare(x):
        """Doc."""
        return x + 1

    @accelerate_model(backends=("jit",), warm_steps=1, cache=False)
    def configured(x):
        return x * 3

    assert isinstance(bare, AcceleratedFunction) and bare.__name__ == "bare"
    assert bare.__doc__ == "Doc." and bare.__wrapped__(1) == 2
    assert configured.backends == ("JIT", "EAGER")
    np.testing.assert_array_equal(np.asarray(configured(jnp.ones(2))), [3.0, 3.0])


def test_as_a_method_the_instance_is_an_argument():
    class Scaler:
        factor = 2.0

        @accelerate_model(warm_steps=1, cache=False)
        def scale(self, x):
            return x * self.factor

    np.testing.assert_array_equal(np.asarray(Scaler().scale(jnp.ones(2))), [2.0, 2.0])


class Tiny(Craft):
    def __init__(self):
        super().__init__("TINY")
        self.fc = dock.Dense(3, 2)

    def run(self, x):
        return self.fc(x)


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: accelerate(42), "fn_or_module"),
        (lambda: accelerate(int), "fn_or_module"),
        (lambda: accelerate(Tiny()), "realize"),
        (lambda: accelerate(busy, backends=["JIT", "TORCH_COMPILE"]), "backends"),
        (lambda: accelerate(busy, patch_backprop=True), "topk_dense"),
        (lambda: accelerate(busy, patch_backprop="yes"), "patch_backprop"),
        (lambda: accelerate(busy, warm_step=3), "warm_step"),
        (lambda: accelerate(busy, warm_steps=0), "warm_steps"),
        (lambda: accelerate(busy, donate_argnums=-1), "donate_argnums"),
        (lambda: accelerate_model(backends="XLA"), "backends"),
        (lambda: accelerate_model(cache=3), "cache"),
    ],
)
def test_bad_arguments_are_argument_errors(call, names):
    with pytest.raises(ArgumentError, match=names):
        call()


# -- what an adversarial review found (each failed before its fix) ------------------------


def test_a_call_with_concrete_arguments_inside_the_callers_trace_passes_through():
    """Closed-over constants are concrete, yet the call is traced: the ladder must not run."""
    fast = accelerate(busy, **ANY_WIN)
    got = jax.jit(lambda y: fast(X) + y)(1.0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(busy)(X) + 1.0), rtol=1e-6)
    got = jax.vmap(lambda y: fast(X)[0] * y)(jnp.arange(3.0))
    assert got.shape == (3, 3)
    assert fast.explain().decisions == []


class _Factor:
    """A fixed leaf that hashes by identity and prints like every other one."""

    def __init__(self, k):
        self.k = k

    def __repr__(self):
        return "Factor()"


@settings(max_examples=5)
@given(ks=st.lists(st.integers(-4, 4), min_size=2, max_size=4))
def test_fixed_leaves_that_print_alike_never_share_a_runner(ks):
    fast = accelerate(lambda x, f: x * f.k, backends=("JIT", "EAGER"), **ANY_WIN)
    for k in ks:
        np.testing.assert_array_equal(np.asarray(fast(X, _Factor(k))), np.asarray(X * k))
    signatures = [d.signature for d in fast.explain().decisions]
    assert len(set(signatures)) == len(ks)


def test_a_signature_does_not_depend_on_an_objects_address():
    """Else a method's (its instance's) decision-cache key would be new in every run."""
    texts = {
        keys.Layout.of(*keys.call_key(((X, obj), {})), [X, obj]).signature
        for obj in (_Factor(1), _Factor(2))
    }
    assert len(texts) == 1 and " at 0x" not in texts.pop()


def test_code_digest_is_the_same_in_every_process():
    """A set constant (`x in {...}`) iterates in an order set by the process's str hashes."""
    script = (
        "from dualtrain.accelerate.decisions import code_digest\n"
        "modes = {'alpha', 'beta'}\n"
        "print(code_digest(lambda x, m: x if m in {'alpha', 'beta', 'gamma', 'delta'} else -x),"
        " code_digest(lambda x, m: x if m in modes else -x))\n"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
            timeout=CHILD_TIMEOUT_S,
        ).stdout
        for seed in range(1, 6)
    }
    assert len(digests) == 1


def test_the_functions_own_error_at_run_time_keeps_the_decision():
    """Eager raising too means the input is at fault, not the rung: no fallback recorded."""

    def refuse(total):
        if total > 100:
            raise ValueError("too big")

    def fn(x):
        jax.debug.callback(refuse, x.sum())
        return busy(x)

    fast = accelerate(fn, backends=("JIT", "EAGER"), **ANY_WIN)
    fast(X)
    with pytest.raises(ValueError, match="too big"):
        fast(X + 100.0)
    decision = fast.explain().decisions[0]
    assert decision.chosen == "JIT" and decision.events == []
    np.testing.assert_allclose(np.asarray(fast(X)), np.asarray(busy(X)), rtol=1e-6)


def test_an_array_passed_twice_to_a_donating_function_runs_that_call_undonated():
    fast = accelerate(lambda p, q: p + q, backends=("JIT_DONATE", "EAGER"), **ANY_WIN)
    fast(jnp.ones(3), jnp.ones(3))
    assert fast.explain().chosen("call") == "JIT_DONATE"
    for first in (True, False):  # the deciding call too
        again = fast if not first else accelerate(fast, backends=("JIT_DONATE",), **ANY_WIN)
        c = jnp.full(3, 2.0)
        np.testing.assert_array_equal(np.asarray(again(c, c)), [4.0, 4.0, 4.0])
        assert not c.is_deleted()
        decision = again.explain().decisions[0]
        assert decision.chosen == "JIT_DONATE" and decision.events == []
    a = jnp.ones(3)
    fast(a, jnp.ones(3))
    assert a.is_deleted()  # distinct arrays: donated as before


def test_a_cached_decision_with_a_corrupted_number_is_ignored(tmp_path):
    options = {**ANY_WIN, "backends": ("JIT", "EAGER"), "cache": tmp_path}
    accelerate(busy, **options)(X)
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    data["decision"]["attempts"][0]["compile_s"] = "fast"
    path.write_text(json.dumps(data))
    again = accelerate(busy, **options)
    again(X)
    assert not again.explain().decisions[0].from_cache
    assert "chosen" in str(again.explain())


class _Sly:
    """A callable object whose traced result is wrong exactly when `tricky`."""

    def __init__(self, tricky):
        self.tricky = tricky

    def __call__(self, x):
        return busy(x) + (1.0 if self.tricky and isinstance(x, jax.core.Tracer) else 0.0)


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["object", "jax.jit"])
def test_a_cached_decision_never_serves_another_callable(tmp_path, wrap):
    """The cache key sees a callable object's attributes and what jax.jit wraps."""
    options = {**ANY_WIN, "backends": ("JIT", "EAGER"), "cache": tmp_path}
    if wrap is jax.jit:
        first, second = jax.jit(lambda x: x + 1.0), jax.jit(lambda x: x * 2.0)
    else:
        first, second = _Sly(False), _Sly(True)
    accelerate(first, **options)(X)
    again = accelerate(second, **options)
    got = again(X)
    with jax.disable_jit():
        want = second(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    assert not again.explain().decisions[0].from_cache


def test_tied_arrays_in_a_donated_argument_run_that_call_undonated():
    """One buffer twice in a donated pytree (tied weights) is refused by XLA if donated."""
    step = accelerate(
        lambda p: jax.tree_util.tree_map(lambda a: a * 0.5, p),
        backends=("JIT_DONATE", "EAGER"),
        **ANY_WIN,
    )
    w = jnp.ones(3)
    got = step({"decoder": w, "encoder": w})
    np.testing.assert_array_equal(np.asarray(got["decoder"]), [0.5] * 3)
    decision = step.explain().decisions[0]
    assert decision.chosen == "JIT_DONATE" and decision.events == [] and not w.is_deleted()


# ---- the fast lane: one signature, a final decision, jit's own dispatch ----------------

# `busy` returns its input's shape: JIT_DONATE could take X (a module constant) away.
NO_DONATION = {**ANY_WIN, "backends": ("JIT", "EAGER")}


def settled(fast, *args, calls=40):
    """`fast` called until its decision is final (the steady-time watch included)."""
    for _ in range(calls):
        out = fast(*args)
    return out


@pytest.fixture
def signatures_built(monkeypatch):
    """Counts the calls whose signature the ladder builds in Python (`call_key`)."""
    import dualtrain_jax.compilation.accelerated as compilation

    built = [0]
    real = compilation.call_key

    def counted(tree):
        built[0] += 1
        return real(tree)

    monkeypatch.setattr(compilation, "call_key", counted)
    return built


def test_after_a_final_decision_calls_go_straight_to_jit(signatures_built):
    fast = accelerate(busy, **NO_DONATION)
    settled(fast, X)
    before = signatures_built[0]
    for seed in range(5):
        x = jnp.asarray(np.random.default_rng(seed).normal(size=(4, 3)).astype(np.float32))
        np.testing.assert_allclose(np.asarray(fast(x)), np.asarray(jax.jit(busy)(x)), rtol=1e-6)
    assert signatures_built[0] == before  # no Python signature per call


def test_a_second_signature_leaves_the_lane_for_the_ladder(signatures_built):
    fast = accelerate(busy, **NO_DONATION)
    settled(fast, X)
    wide = jnp.ones((6, 3), jnp.float32)
    np.testing.assert_allclose(np.asarray(fast(wide)), np.asarray(busy(wide)), rtol=1e-6)
    assert len(fast.explain().decisions) == 2  # the ladder decided the new signature
    before = signatures_built[0]
    fast(X), fast(wide)
    assert signatures_built[0] == before + 2  # two signatures: each call is looked up again


def test_an_array_passed_twice_through_a_donating_lane_runs_that_call_undonated(
    signatures_built,
):
    fast = accelerate(lambda p, q: p + q, backends=("JIT_DONATE", "EAGER"), **ANY_WIN)
    settled(fast, jnp.ones(3), jnp.ones(3), calls=1)
    for _ in range(40):
        fast(jnp.ones(3), jnp.ones(3))
    assert fast.explain().chosen("call") == "JIT_DONATE"
    c = jnp.full(3, 2.0)
    np.testing.assert_array_equal(np.asarray(fast(c, c)), [4.0, 4.0, 4.0])
    assert not c.is_deleted() and fast.explain().decisions[0].events == []
    before = signatures_built[0]
    a = jnp.ones(3)
    fast(a, jnp.ones(3))
    assert a.is_deleted()  # distinct arrays: donated as before
    # Seen in the lane, before XLA was asked to donate one buffer twice: the lane stays.
    assert signatures_built[0] == before


def test_the_callers_transformations_pass_through_a_lane_and_keep_it(signatures_built):
    fast = accelerate(busy, **NO_DONATION)
    settled(fast, X)
    np.testing.assert_allclose(
        np.asarray(jax.jit(fast)(X * 2)), np.asarray(jax.jit(busy)(X * 2)), rtol=1e-6
    )
    assert jax.vmap(fast)(X).shape == X.shape
    with jax.disable_jit():
        np.testing.assert_allclose(np.asarray(fast(X)), np.asarray(busy(X)), rtol=1e-6)
    before = signatures_built[0]
    fast(X)
    assert signatures_built[0] == before and len(fast.explain().decisions) == 1


def test_a_donating_lane_takes_a_call_of_another_structure_to_the_ladder():
    def step(batch, state):
        return batch.sum(), tuple(s + 1 for s in state)

    fast = accelerate(step, donate_argnums=1, **ANY_WIN)
    for _ in range(40):
        fast(jnp.ones(2), (jnp.ones(3), jnp.ones(3), jnp.ones(3)))
    out = fast(jnp.ones(2), (jnp.ones(3),))  # fewer leaves than the lane's signature
    np.testing.assert_array_equal(np.asarray(out[1][0]), [2.0, 2.0, 2.0])
    assert len(fast.explain().decisions) == 2


def test_a_host_callback_may_decide_another_accelerated_function_during_a_lane_call():
    inner = accelerate(lambda v: jnp.tanh(v) * 2, **NO_DONATION)
    armed = [False]

    def report(v):
        if armed[0]:  # its first call, inside a lane call of `outer`: a ladder of its own
            inner(jnp.asarray(v))

    def outer(x):
        jax.debug.callback(report, x)
        return busy(x)

    fast = accelerate(outer, **NO_DONATION)
    settled(fast, X)
    armed[0] = True
    fast(X)
    inner_decisions = inner.explain().decisions
    assert [d.chosen for d in inner_decisions] == ["JIT"]  # not refused as a lane's trace
    assert all("NewSignature" not in a.reason for d in inner_decisions for a in d.attempts)


@pytest.mark.multidevice
def test_inputs_jit_runs_without_a_trace_still_reach_the_ladder():
    fast = accelerate(busy, **NO_DONATION)
    settled(fast, X)
    for x in (np.asarray(X), jax.device_put(X, jax.devices()[1])):
        for _ in range(2):  # the first may run on the lane; the ladder sees the next
            np.testing.assert_allclose(np.asarray(fast(x)), np.asarray(busy(X)), rtol=1e-6)
    assert len(fast.explain().decisions) == 3


def test_a_runtime_failure_in_the_lane_runs_the_compiled_step_once_then_eager():
    runs, armed = [], [False]

    def count(x):
        runs.append(jax.config.jax_disable_jit)
        if armed[0] and not jax.config.jax_disable_jit:
            raise RuntimeError("the compiled kernel broke")

    def fn(x):
        jax.debug.callback(count, x)
        return busy(x)

    fast = accelerate(fn, backends=("JIT", "EAGER"), **ANY_WIN)
    settled(fast, X)
    armed[0], before = True, len(runs)
    np.testing.assert_allclose(np.asarray(fast(X)), np.asarray(busy(X)), rtol=1e-6)
    assert runs[before:] == [False, True]  # the compiled run that failed, then eager's
    assert fast.explain().decisions[0].chosen == "EAGER"
