"""Multiverse under JAX: data-parallel steps over a device mesh equal single-device steps.

In this process: a 4-device mesh (tests/conftest.py makes 4 host devices). In two processes
joined by ``jax.distributed`` on localhost (2 devices each): one spawned run measures every
law there at once, and the test process compares with its single-device references.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

import dualtrain
from dualtrain import ArgumentError, Tank
from dualtrain.fuel import FuelGenerator
from dualtrain.multiverse.seams import Steps
from dualtrain.multiverse.world import World
from dualtrain_jax import realize
from dualtrain_jax.distributed import join
from tests.fuel.raw import DTYPES, make_folder
from tests.multiverse.jax.distributed_universes import (
    CLASSES,
    MLP,
    SPEC,
    batch,
    image_loss,
    optimizer,
    reference,
    two_processes,
)

RTOL, ATOL = 1e-5, 1e-6


def run(universe, nworld=4, **options):
    """``universe(mv)`` on a Multiverse of `nworld` devices in this process; its result."""
    return dualtrain.Multiverse(universe, nworld, backend="jax", **options)()


def host(tree):
    return jax.tree.map(np.asarray, tree)


def assert_close(got, want):
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key]), want[key], rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """An npz pack of 16 RAW 4x4 RGB images with labels 0..4."""
    folder = tmp_path_factory.mktemp("raw")
    make_folder(str(folder), 16, size=(4, 4))
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    return gen.generate(str(folder / "p.npz"), 4, 4, encode="RAW", workers=0).paths[0]


# ---- one process, 4 devices ---------------------------------------------------------------


@settings(max_examples=4)
@given(
    rows=st.sampled_from([4, 8, 12, 16]),
    seed=st.integers(0, 2**31 - 1),
    lr=st.floats(1e-3, 0.3),
    name=st.sampled_from(["sgd", "adam"]),
)
def test_steps_on_4_devices_equal_single_device_steps(rows, seed, lr, name):
    net = realize(MLP(), seed=seed % 1000)
    batches = [(*batch(seed + k, rows), None) for k in range(3)]
    want, want_losses = reference(net, name, lr, batches)

    def universe(mv):
        learner = mv.learner(mv.sync(net), optimizer(name, lr))
        losses = [float(learner.step(x, y)) for x, y, _ in batches]
        spec = learner.model.params["fc1.weight"].sharding.spec
        return losses, host(learner.model.params), spec, learner.steps, mv.step, mv.nworld

    losses, params, spec, steps, counted, nworld = run(universe)
    np.testing.assert_allclose(losses, want_losses, rtol=RTOL)
    assert_close(params, want)
    assert (spec, steps, counted, nworld) == (P(), 3, 3, 4)


def test_pmap_engine_equals_jit_engine():
    net = realize(MLP(), seed=5)
    batches = [batch(k, 8) for k in range(3)]

    def universe(mv):
        synced = mv.sync(net)
        out = {}
        for engine in ("jit", "pmap"):
            learner = mv.learner(synced, optax.adam(0.05), engine=engine)
            with mv.scope():  # the mesh is the default inside; steps work the same there
                assert jax.sharding.get_abstract_mesh() == mv.runtime.mesh.abstract_mesh
                losses = [float(learner.step(x, y)) for x, y in batches]
            sharding = learner.model.params["fc2.bias"].sharding
            out[engine] = losses, host(learner.model.params), host(learner.opt_state), sharding
        return out

    out = run(universe)
    (jit_losses, jit_params, jit_opt, jit_sharding) = out["jit"]
    (pmap_losses, pmap_params, pmap_opt, pmap_sharding) = out["pmap"]
    np.testing.assert_allclose(pmap_losses, jit_losses, rtol=RTOL)
    assert_close(pmap_params, jit_params)
    for a, b in zip(jax.tree.leaves(pmap_opt), jax.tree.leaves(jit_opt), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    assert pmap_sharding.spec == jit_sharding.spec == P()  # pmap's results in the jit form


@settings(max_examples=3)
@given(
    keep=st.lists(st.booleans(), min_size=8, max_size=8).filter(any),
    engine=st.sampled_from(["jit", "pmap"]),
)
def test_masked_step_is_the_mean_over_the_kept_rows(keep, engine):
    net = realize(MLP(), seed=2)
    x, y = batch(7, 8)
    mask = np.array(keep)
    want, want_losses = reference(net, "sgd", 0.1, [(x[mask], y[mask], None)])

    def universe(mv):
        learner = mv.learner(mv.sync(net), optax.sgd(0.1), engine=engine)
        return float(learner.step(x, y, mask)), host(learner.model.params)

    loss, params = run(universe)
    np.testing.assert_allclose(loss, want_losses[0], rtol=RTOL)
    assert_close(params, want)


def test_a_params_pytree_steps_with_its_loss_function_under_both_engines():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (8, 4, 4, 3)).astype(np.uint8)
    y = rng.integers(0, CLASSES, 8).astype(np.int32)
    params = {"w": rng.normal(size=(48, CLASSES)).astype(np.float32), "b": np.zeros(3, "f4")}
    grads = jax.grad(lambda p: image_loss(p, x, y).mean())(params)
    want = {k: params[k] - 0.5 * np.asarray(grads[k]) for k in params}

    def universe(mv):
        synced, out = mv.sync(params), []
        for engine in ("jit", "pmap"):
            learner = mv.learner(synced, optax.sgd(0.5), image_loss, engine)
            learner.step(x, y)
            out.append(host(learner.model))
        return out

    for got in run(universe):
        assert_close(got, want)
    with pytest.raises(ArgumentError, match="loss_fn"):  # a pytree has no default loss
        run(lambda mv: mv.learner(mv.sync(params), optax.sgd(0.5)))


def test_a_scalar_loss_with_a_mask_is_refused():
    def universe(mv):
        learner = mv.learner(mv.sync(realize(MLP())), optax.sgd(0.1), lambda out, y: out.mean())
        x, y = batch(0, 4)
        learner.step(x, y, np.ones(4, bool))

    with pytest.raises(ArgumentError, match=r"loss_fn must be a loss returning per-sample"):
        run(universe)


def test_reduce_and_gather_with_one_process_return_the_value():
    value = {"f": 2.5, "n": np.float32(3), "a": np.arange(3.0), "j": jnp.ones(2), "i": 4}

    def universe(mv):
        return mv.reduce(value), mv.reduce(value, aggregate=True), mv.runtime.gather_object(7)

    mean, total, gathered = run(universe)
    for got in (mean, total):
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in value.items()}
        assert_close(got, {k: np.asarray(v) for k, v in value.items()})
    assert gathered == [7]


def test_a_synced_tank_delivers_batches_sharded_over_the_mesh(pack):
    tank = Tank(pack, SPEC, 8, shuffle=False, to="jax", cast="same_kind")

    def universe(mv):
        mv.sync((), data=tank)
        first = tank.next()
        return first["image"].sharding, first["image"].shape, mv.runtime.mesh

    sharding, shape, mesh = run(universe)
    assert sharding == NamedSharding(mesh, P("data"))
    assert shape == (8, 4, 4, 3)
    assert len(sharding.device_set) == 4


def test_join_refuses_more_devices_than_there_are_and_a_bad_engine():
    with pytest.raises(ArgumentError, match=r"nworld must be at most 4.*; got nworld=8"):
        run(lambda mv: mv.init(), nworld=8)
    with pytest.raises(ArgumentError, match="engine"):
        dualtrain.Multiverse(lambda mv: None, 4, backend="jax", engine="vmap")
    with pytest.raises(ArgumentError, match="engine"):
        run(lambda mv: mv.learner(realize(MLP()), optax.sgd(0.1), engine="xmap"))
    runtime = join(World(local_devices=4), timeout=30, steps=Steps(lambda: None))
    with pytest.raises(ArgumentError, match=r"engine must be 'jit'.*; got engine='shard'"):
        runtime.learner(realize(MLP()), optax.sgd(0.1), None, "shard")
    with pytest.raises(ArgumentError, match="bucket_cap_mb"):
        runtime.sync_model(realize(MLP()), {"bucket_cap_mb": 25})
    with pytest.raises(ArgumentError, match="rows that split over the 4 devices"):
        runtime.learner(realize(MLP()), optax.sgd(0.1), None, "jit").step(*batch(0, 6))


# ---- two processes, 2 devices each, joined by jax.distributed --------------------------------


def test_two_processes_joined_by_jax_distributed_obey_the_laws(pack):
    x, y = batch(11, 8)
    mv = dualtrain.Multiverse(two_processes, 4, backend="jax", processes=2, timeout=300)
    out = mv(x, y, pack)
    assert (out["nworld"], out["local"]) == (4, 2)
    net = realize(MLP(), seed=0)  # rank 0's parameters
    for engine in ("jit", "pmap"):
        for name in ("sgd", "adam"):
            want, want_losses = reference(net, name, 0.05, [(x, y, None)] * 3)
            losses, every_rank = out[engine, name]
            np.testing.assert_allclose(losses, want_losses, rtol=RTOL)
            for params in every_rank:
                assert_close(params, want)
    per_rank = [{"f": 1.5 * (r + 1), "a": np.arange(3.0) * (r + 2), "i": r + 1} for r in range(2)]
    for got, combine in ((out["mean"], np.mean), (out["sum"], np.sum)):
        for key in ("f", "a", "i"):
            want = combine([np.asarray(v[key]) for v in per_rank], axis=0)
            np.testing.assert_allclose(got[key], want, rtol=1e-12)
    assert type(out["mean"]["i"]) is float and type(out["sum"]["i"]) is int
    assert out["gathered"] == [("rank", 0), ("rank", 1)]
    assert "same structure and shapes on every process" in out["mismatch"]
    spec, shape = out["tank"][:2]
    assert (spec, shape) == (str(P("data")), (8, 4, 4, 3))
    rows = [Tank(pack, SPEC, 4, shuffle=False, cast="same_kind", rank=r, world=2).next()
            for r in range(2)]  # fmt: skip
    images = np.concatenate([r["image"] for r in rows])
    labels = np.concatenate([r["label"] for r in rows])
    zeros = {"w": np.zeros((48, CLASSES), np.float32), "b": np.zeros(CLASSES, np.float32)}
    value, grads = jax.value_and_grad(lambda p: image_loss(p, images, labels).mean())(zeros)
    for loss, params in (out["tank"][2:], out["tank pmap"]):
        np.testing.assert_allclose(loss, float(value), rtol=RTOL)
        assert_close(params, {k: -0.5 * np.asarray(g) for k, g in grads.items()})


# ---- what a demanding user meets: wrong inputs, other keys, resuming, pmap's compiles -------


def test_step_refuses_inputs_that_would_give_wrong_numbers_and_takes_any_key():
    net = realize(MLP(), seed=3)
    x, y = batch(4, 8)
    _, want_losses = reference(net, "sgd", 0.1, [(x, y, None)])

    def universe(mv):
        learner = mv.learner(mv.sync(net), optax.sgd(0.1))
        # (8, 1) broadcast against the per-sample losses (8,) gave an 8x loss, silently.
        with pytest.raises(ArgumentError, match=r"mask must be booleans of shape \(8,\)"):
            learner.step(x, y, np.ones((8, 1), bool))
        # No rows: 0 / 0 made every parameter NaN.
        with pytest.raises(ArgumentError, match=r"targets must be rows"):
            learner.step(x[:0], y[:0])
        # Under jax.jit: a house error, not a tracer-conversion error from inside.
        with pytest.raises(ArgumentError, match=r"outside jax\.jit"):
            jax.jit(learner.step)(x, y)
        assert learner.steps == 0  # nothing above stepped
        losses = [
            float(learner.step(x, y, [True] * 8)),  # a list is one mask, not 8 scalars
            float(learner.step(x, y, rng=jax.random.key(1, impl="rbg"))),  # any PRNG impl
            float(learner.step(x, y, rng=jax.random.PRNGKey(1))),  # a legacy raw key
        ]
        return losses

    losses = run(universe)
    np.testing.assert_allclose(losses[0], want_losses[0], rtol=RTOL)
    assert all(np.isfinite(losses))


class DropoutMLP(MLP):
    def __init__(self) -> None:
        super().__init__("DMLP")
        self.drop = dualtrain.dock.Dropout(0.5)

    def run(self, x):
        return self.fc2(self.drop(jnp.tanh(self.fc1(x))))


@pytest.mark.parametrize("nworld", [1, 4])
def test_the_default_dropout_key_is_fold_in_of_the_step_count_derived_in_one_call(nworld):
    """The step derives ``fold_in(key(0), steps)`` inside its one jitted call: the same
    masks as that key given by hand, NumPy rows placed by the call itself, one compile."""
    net = realize(DropoutMLP(), seed=2)
    batches = [batch(40 + k, 8) for k in range(3)]

    def universe(mv):
        default = mv.learner(mv.sync(net), optax.sgd(0.1))
        given_key = mv.learner(mv.sync(net), optax.sgd(0.1))
        pairs = []
        for k, (x, y) in enumerate(batches):
            rng = jax.random.fold_in(jax.random.key(0), k)
            pairs.append((float(default.step(x, y)), float(given_key.step(x, y, rng=rng))))
        params = host(default.model.params), host(given_key.model.params)
        other = float(default.step(*batches[0], rng=jax.random.key(9)))
        (fn,) = [f for v, f in default._steps.items() if v[1] is None]
        return pairs, *params, other, fn._cache_size()

    pairs, got, want, other, compiled = run(universe, nworld)
    for a, b in pairs:
        assert a == b
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    assert np.isfinite(other)
    assert compiled == 1  # NumPy rows at every step: one compile


def test_a_checkpoint_loaded_into_learner_model_and_opt_state_resumes_the_run(tmp_path):
    net = realize(MLP(), seed=6)
    batches = [batch(20 + k, 8) for k in range(3)]

    def universe(mv):
        anchors = mv.time_machine(dualtrain.TimeMachine(save_path=tmp_path, max_anchors=1))
        learner = mv.learner(mv.sync(net), optax.adam(0.05))
        for x, y in batches[:2]:
            learner.step(x, y)
        anchors.drop(learner.model, optimizer=learner.opt_state, step=learner.steps)
        want = float(learner.step(*batches[2])), host(learner.model.params)
        # A new run: torch's learner loads in place; JAX's takes the module it handed out.
        resumed = mv.learner(mv.sync(realize(MLP(), seed=7)), optax.adam(0.05))
        restored = anchors.to(resumed.model, optimizer=resumed.opt_state)
        resumed.opt_state = restored.optimizer
        got = float(resumed.step(*batches[2])), host(resumed.model.params)
        with pytest.raises(ArgumentError, match="opt_state"):
            resumed.opt_state = optax.sgd(0.1).init(net.params)
        with pytest.raises(
            ArgumentError,
            match=r"model must have the learner.s shapes: \(3,\) at .*fc2\.bias.*; got \(4,\)",
        ):
            resumed.model = realize(MLP(), seed=0).replace(
                params={**net.params, "fc2.bias": np.zeros(4, np.float32)}
            )
        return want, got

    (want_loss, want_params), (got_loss, got_params) = run(universe)
    np.testing.assert_allclose(got_loss, want_loss, rtol=RTOL)
    assert_close(got_params, want_params)


def test_pmap_compiles_its_step_once_and_steps_a_tank_batch_where_it_lies(pack):
    compiles = []

    def count(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    tank = Tank(pack, SPEC, 8, shuffle=False, to="jax", cast="same_kind")
    zeros = {"w": np.zeros((48, CLASSES), np.float32), "b": np.zeros(CLASSES, np.float32)}

    def universe(mv):
        mv.sync((), data=tank)
        first = tank.next()
        out = {}
        for engine in ("jit", "pmap"):
            learner = mv.learner(mv.sync(zeros), optax.sgd(0.5), image_loss, engine)
            losses = [float(learner.step(first["image"], first["label"]))]
            before = len(compiles)
            losses += [float(learner.step(first["image"], first["label"])) for _ in range(2)]
            out[engine] = losses, len(compiles) - before, host(learner.model)
        return out

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        out = run(universe)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    (jit_losses, jit_compiles, jit_params), (losses, pmap_compiles, params) = out.values()
    assert (jit_compiles, pmap_compiles) == (0, 0)
    np.testing.assert_allclose(losses, jit_losses, rtol=RTOL)
    assert_close(params, jit_params)


def test_leaving_waits_for_the_work_this_process_dispatched():
    """`leave` returns once every array dispatched is computed (the run's collectives in
    them entered), as torch's leave waits for gloo's threads: a process that ended with a
    step still queued left its peers waiting in a collective until the run's timeout."""
    from dualtrain_jax.distributed import exit

    runtime = join(World(local_devices=4), timeout=30, steps=Steps(lambda: None))
    x = jnp.ones((1500, 1500))
    chain = jax.jit(lambda a: [a := jnp.tanh(a @ a) for _ in range(6)][-1])
    out = chain(x)  # returns at once: dispatched, not yet computed
    runtime.leave()
    assert out.is_ready() and exit.pending() == 0
    exit.release()  # idempotent, and nothing left to wait for
