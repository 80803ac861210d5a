"""dualtrain_jax.accelerate on realized modules, and TrainingLearner.

Laws: K train steps under the chosen rung equal K op-by-op steps and K plain ``jax.jit``
steps (an MLP and a small CNN, both with BatchNorm and Dropout); a candidate whose
gradients are wrong is rejected in training mode; train and eval are decided separately;
the accelerated module stays a JaxModule (pytree, keys, pickling, checkpoints).
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import TimeMachine
from dualtrain.craft import Craft, dock
from dualtrain.errors import ArgumentError

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy
from dualtrain_jax.compilation import AcceleratedModule, accelerate  # noqa: E402
from dualtrain_jax.compilation.learner import TrainingLearner  # noqa: E402
from dualtrain_jax.craft import JaxModule, Nozzle, Rudder, realize  # noqa: E402

# no compile budget: a verdict must not turn on how busy the machine is
# budget=inf: the whole ladder at the first call
# (payback: tests/accelerate/test_accelerate_payback.py)
FAST = {"warm_steps": 1, "cache": False, "compile_budget": 1e9, "budget": math.inf}
ANY_WIN = {**FAST, "min_speedup": 1e-9}  # a verified candidate is always chosen
KEY = jax.random.key(3)


class Mlp(Craft):
    def __init__(self):
        super().__init__("MLP")
        self.fc1, self.bn = dock.Dense(4, 16), dock.BatchNorm(16)
        self.drop, self.fc2 = dock.Dropout(0.25), dock.Dense(16, 3)

    def run(self, x):
        return self.fc2(self.drop(dock.relu(self.bn(self.fc1(x)))))


class Cnn(Craft):
    def __init__(self):
        super().__init__("CNN")
        self.conv, self.bn = dock.Conv(1, 4, 3, padding=1), dock.BatchNorm(4)
        self.pool, self.drop = dock.GlobalAvgPool(), dock.Dropout(0.25)
        self.fc = dock.Dense(4, 3)

    def run(self, x):
        return self.fc(self.drop(self.pool(dock.relu(self.bn(self.conv(x))))))


SHAPES = {Mlp: (8, 4), Cnn: (4, 1, 6, 6)}


def batch(craft, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=SHAPES[craft]).astype(np.float32)
    y = rng.integers(0, 3, size=SHAPES[craft][0]).astype(np.int32)
    return jnp.asarray(x), jnp.asarray(y)


def reference_step(module, tx):
    """The plain train step, written out independently of dualtrain_jax.compilation.learner."""

    def step(params, state, opt_state, x, y, rng):
        def loss(p):
            out, new_state = module.apply(p, state, x, train=True, rng=rng)
            return optax.softmax_cross_entropy_with_integer_labels(out, y).mean(), new_state

        (value, new_state), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state, opt_state, value

    return step


def assert_trees_close(got, want, rtol=2e-4, atol=2e-5):
    pairs = zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True)
    for g, w in pairs:
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("decisions")


@pytest.mark.parametrize("craft", [Mlp, Cnn])
@settings(max_examples=2)
@given(seed=st.integers(0, 2**16), steps=st.integers(1, 3))
def test_k_learner_steps_equal_k_eager_steps_and_k_plain_jit_steps(
    craft, seed, steps, shared_cache
):
    """The first example climbs the ladder; the next reads its decision from the cache."""
    model = realize(craft(), seed=seed)
    tx = optax.sgd(0.1, momentum=0.9)
    learner = TrainingLearner(model, optimizer=tx, **{**ANY_WIN, "cache": shared_cache})
    plain = reference_step(model, tx)
    jitted = jax.jit(plain)
    eager = (model.params, model.state, tx.init(model.params))
    compiled = eager
    for k in range(steps):
        x, y = batch(craft, seed + k)
        rng = jax.random.fold_in(KEY, k)
        loss = learner.step(x, y, rng=rng)
        with jax.disable_jit():
            *eager, eager_loss = plain(*eager, x, y, rng)
        *compiled, _ = jitted(*compiled, x, y, rng)
        np.testing.assert_allclose(float(loss), float(eager_loss), rtol=1e-4)
    assert learner.explain().chosen("step") in ("JIT", "JIT_DONATE")  # a compiled rung
    got = (learner.model.params, learner.model.state, learner.opt_state)
    assert_trees_close(got, eager)
    assert_trees_close(got, compiled)
    assert learner.steps == steps
    # the learner trains its own copy: donation never reaches the caller's module
    assert not any(a.is_deleted() for a in jax.tree_util.tree_leaves(model))
    assert not np.allclose(np.asarray(learner.model.state["bn.running_mean"]), 0.0)


def test_a_candidate_with_wrong_gradients_is_rejected_in_training_mode_only():
    @jax.custom_vjp
    def shaky(x):
        return x

    def fwd(x):
        return x, x

    def bwd(residual, g):  # traced (under jit), the backward doubles: a wrong gradient
        return (g * 2 if isinstance(residual, jax.core.Tracer) else g,)

    shaky.defvjp(fwd, bwd)

    class Shaky(Craft):
        def __init__(self):
            super().__init__("SHAKY")
            self.fc = dock.Dense(4, 3)

        def run(self, x):
            return shaky(self.fc(x))

    fast = accelerate(realize(Shaky(), seed=1), backends=("JIT", "EAGER"), **ANY_WIN)
    x, _ = batch(Mlp, 0)
    fast.apply(fast.params, fast.state, x, train=True, rng=KEY)
    fast.apply(fast.params, fast.state, x, train=False)
    explained = fast.explain()
    assert explained.chosen("train") == "EAGER"
    (jit,) = [a for a in explained.decisions[0].attempts if a.rung == "JIT"]
    assert jit.status == "rejected" and "grad" in jit.reason
    assert explained.chosen("eval") == "JIT"  # the forward is right: eval may compile


def test_train_and_eval_are_decided_separately_and_keep_dropout_and_batchnorm_right():
    module = realize(Mlp(), seed=2)
    fast = accelerate(module, **ANY_WIN)
    x, _ = batch(Mlp, 1)
    with Rudder(fast, module):
        got = fast(x, rng=KEY)
        with jax.disable_jit():
            want = module(x, rng=KEY)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert_trees_close(fast.state, module.state, rtol=1e-5, atol=1e-6)  # BatchNorm moved
    with Nozzle(fast, module):
        got, want = fast(x), module(x)
        again = fast(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(again))  # no dropout in eval
    explained = fast.explain()
    assert [d.mode for d in explained.decisions] == ["train", "eval"]
    assert explained.chosen("train") == explained.chosen("eval") == "JIT"
    for decision in explained.decisions:
        status = {a.rung: a.status for a in decision.attempts}
        assert status["JIT_DONATE"] == "unavailable"  # an apply never donates your arrays


def test_the_accelerated_module_is_still_a_jax_module(tmp_path):
    module = realize(Mlp(), seed=4)
    fast = accelerate(module, **FAST)
    x, _ = batch(Mlp, 2)
    assert isinstance(fast, JaxModule) and isinstance(fast, AcceleratedModule)
    assert sorted(fast.params) == sorted(module.params)
    assert sorted(fast.state) == sorted(module.state)
    leaves = jax.tree_util.tree_leaves(fast)
    assert len(leaves) == len(jax.tree_util.tree_leaves(module))
    copy = jax.tree_util.tree_map(lambda a: a, fast)
    assert type(copy) is AcceleratedModule and copy.accelerator is fast.accelerator
    np.testing.assert_allclose(  # inside the caller's jit: the plain apply, traced
        np.asarray(jax.jit(lambda m, v: m(v))(fast, x)), np.asarray(module(x)), rtol=1e-6
    )
    assert fast.explain().decisions == []
    thawed = pickle.loads(pickle.dumps(fast))
    assert type(thawed) is AcceleratedModule
    np.testing.assert_allclose(np.asarray(thawed(x)), np.asarray(module(x)), rtol=1e-5)
    assert type(fast.replace(params=module.params)) is AcceleratedModule
    assert type(fast.unwrap()) is JaxModule
    machine = TimeMachine(save_path=tmp_path)
    path = machine.drop(fast)
    other = accelerate(realize(Mlp(), seed=5), **FAST)
    machine.to(other, path)
    assert_trees_close(other.params, fast.params, rtol=0, atol=0)


def test_patch_backprop_is_listed_and_verified():
    module = realize(Mlp(), seed=6)
    fast = accelerate(module, patch_backprop=True, backends=("JIT", "EAGER"), **ANY_WIN)
    x, _ = batch(Mlp, 3)
    fast.apply(fast.params, fast.state, x, train=True, rng=KEY)
    explained = fast.explain()
    assert explained.chosen("train") == "JIT"  # the top-k backward compiles to the same
    lines = explained.approximations
    assert any("fc1: top-1 of 16" in line for line in lines)
    assert any("fc2: top-1 of 3" in line for line in lines)
    assert "approximate (patch_backprop)" in str(explained)
    # Patched before it was accelerated: still approximate, and said so.
    from dualtrain_jax.sparse_backprop import patch_dense

    before = accelerate(patch_dense(realize(Mlp(), seed=6), k=2)[0], **ANY_WIN)
    before.apply(before.params, before.state, x, train=True, rng=KEY)
    assert any("fc1: top-2 of 16" in line for line in before.explain().approximations)


def test_the_learner_forward_and_explain():
    learner = TrainingLearner(realize(Mlp(), seed=7), optimizer=optax.sgd(0.1), **ANY_WIN)
    x, y = batch(Mlp, 4)
    learner.model.train = False
    np.testing.assert_allclose(
        np.asarray(learner(x)), np.asarray(learner.model.unwrap()(x)), rtol=1e-6
    )
    learner.step(x, y)
    learner.step((x,), y)  # a tuple of inputs too; the default dropout key changes per step
    modes = [d.mode for d in learner.explain().decisions]
    assert modes == ["eval", "step"]
    assert learner.steps == 2


def test_the_learner_checks_its_arguments():
    model = realize(Mlp(), seed=8)
    with pytest.raises(ArgumentError, match="realize"):
        TrainingLearner(Mlp())
    with pytest.raises(ArgumentError, match="loss_fn"):
        TrainingLearner(model, loss_fn=3)
    with pytest.raises(ArgumentError, match="optimizer"):
        TrainingLearner(model, optimizer="adam")
    with pytest.raises(ArgumentError, match="backends"):
        TrainingLearner(model, backends=("FAST",))
    with pytest.raises(ArgumentError, match="optimizer"):
        TrainingLearner(model, **FAST).step(*batch(Mlp, 0))


@pytest.mark.parametrize(
    "loss_fn",
    [lambda o, t: (jnp.mean(o), {"aux": o}), lambda o, t: jnp.mean(o, axis=0)],
    ids=["loss-aux-pair", "vector"],
)
def test_a_loss_that_is_no_scalar_is_an_argument_error(loss_fn):
    learner = TrainingLearner(
        realize(Mlp(), seed=9), optimizer=optax.sgd(0.1), loss_fn=loss_fn, **FAST
    )
    with pytest.raises(ArgumentError, match="loss_fn must be a function returning a scalar"):
        learner.step(*batch(Mlp, 1))


def test_bfloat16_parameters_are_compared_at_bfloat16_precision():
    """A bf16 model (its BatchNorm statistics too: float32 ones would promote activations
    into a bf16 Dense, which dock refuses): a float32 tolerance rejected JIT."""
    net = realize(Mlp(), seed=0)
    bf16 = lambda tree: jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), tree)  # noqa: E731
    net = net.replace(params=bf16(net.params), state=bf16(net.state))
    fast = accelerate(net, backends=("JIT", "EAGER"), **ANY_WIN)
    x = jnp.ones((8, 4), jnp.bfloat16)
    assert fast(x).dtype == jnp.bfloat16
    assert fast.explain().chosen("eval") == "JIT"

    def sly(x):  # wrong by far more than bfloat16's rounding, and only when traced
        return x.astype(jnp.float32) * 2.0 + (0.05 if isinstance(x, jax.core.Tracer) else 0.0)

    wrong = accelerate(sly, backends=("JIT", "EAGER"), **ANY_WIN)
    wrong(x)
    assert wrong.explain().chosen("call") == "EAGER"
