"""Multiverse under torch: real gloo process groups, DDP, and the data-parallel laws.

The 2-process laws run in ONE spawned run (each worker imports torch: seconds) that returns
every rank's numbers; the parent checks them against plain single-process torch. A world of
one process joins in this process, with no process group and no DDP, for the cheap
Hypothesis laws.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn
from torch.nn import functional as F  # noqa: N812 - torch's own spelling

import dualtrain
from dualtrain.errors import ArgumentError, ShapeError
from dualtrain.multiverse.seams import Steps
from dualtrain.multiverse.world import World
from dualtrain_torch.distributed import SoloModule, TorchRuntime, join
from tests.multiverse.torch import distributed_universes as U  # noqa: N812 - short: used throughout

TOL = {"rtol": 1e-5, "atol": 1e-6}


# ---- two gloo processes: every law from one run ----------------------------------------


@pytest.fixture(scope="module")
def ranks():
    """Each rank's numbers from `U.laws` on 2 spawned gloo processes, by rank."""
    options = {"find_unused_parameters": True, "bucket_cap_mb": 1}
    return dualtrain.Multiverse(U.laws, 2, backend="torch", timeout=300, **options)()


def reference(kind, opt, inputs, targets, loss=None):
    """Plain single-process torch from rank 0's initial weights: losses and final weights."""
    net = U.model(kind, seed=0)
    optimizer = U.optimizer(opt, net.parameters())
    losses = []
    for x, y in zip(inputs, targets, strict=True):
        optimizer.zero_grad()
        value = (loss or F.cross_entropy)(net(x), y)
        value.backward()
        optimizer.step()
        losses.append(float(value.detach()))
    return losses, U.params(net)


def assert_same(got, want):
    (got_losses, got_params), (want_losses, want_params) = got, want
    np.testing.assert_allclose(got_losses, want_losses, **TOL)
    assert got_params.keys() == want_params.keys()
    for name in want_params:
        np.testing.assert_allclose(got_params[name], want_params[name], **TOL, err_msg=name)


def test_the_run_is_two_gloo_processes_on_the_host(ranks):
    assert [r["nworld"] for r in ranks] == [2, 2]
    assert {r["backend"] for r in ranks} == {"gloo"}
    assert {r["batch_device"] for r in ranks} == {None}
    # each learner step counts once; each synced forward in training mode counts once
    # (7 learners, then 2 hand-written loops of STEPS forwards)
    assert [r["steps"] for r in ranks] == [7 * U.STEPS + 2 * U.STEPS] * 2
    # every tensor handed to a collective was dropped by gloo's threads before leaving
    assert [r["released"] for r in ranks] == [(True, 0)] * 2
    # the Multiverse's options reach each learner's DDP
    assert [r["ddp"] for r in ranks] == [("SyncedModule", True, 1024 * 1024)] * 2
    assert [r["forwarded"] for r in ranks] == [True, True]


@pytest.mark.parametrize("kind", U.KINDS)
@pytest.mark.parametrize("opt", U.OPTIMIZERS)
def test_one_step_on_two_workers_is_one_step_on_the_double_batch(ranks, kind, opt):
    """LAW: 2 workers x b rows == one plain step on the 2b rows, K steps, SGD and Adam."""
    x, y = U.batches(2)
    want = reference(kind, opt, x, y)
    for r in ranks:  # rank 1 started from other weights: sync gave it rank 0's
        assert_same(r[f"learner/{kind}/{opt}"], want)


def test_a_learner_step_runs_only_the_collectives_of_ddp_by_hand(ranks):
    """The rows and the loss ride in DDP's first gradient bucket: no collective of its own."""
    # this run's DDP finds unused parameters: one all-reduce of its used-parameter map
    # more a backward, by hand too
    assert [r["collectives"] for r in ranks] == [(2, 2)] * 2


def test_a_hand_written_step_on_a_learners_model_is_ddps_mean(ranks):
    """Outside a learner step, the learner's comm hook is DDP's own: the mean of the ranks."""
    x, y = U.batches(2)
    _, want = reference("module", "sgd", x[:2], y[:2])
    for r in ranks:
        for name, value in want.items():
            np.testing.assert_allclose(r["hand_after_learner"][name], value, **TOL)


def test_a_comm_hook_registered_after_a_learners_step_is_refused_naming_the_fix(ranks):
    for r in ranks:
        assert "registered before the learner's first step" in r["late_hook"]


def test_a_model_with_its_own_comm_hook_keeps_it_and_meets_the_law(ranks):
    x, y = U.batches(2)
    want = reference("module", "sgd", x, y)
    for r in ranks:
        got, collectives = r["own_hook"]
        assert_same(got, want)
        by_hand = r["collectives"][1]
        assert collectives == (by_hand + 2) * U.STEPS  # DDP's, the rows and the loss


def test_every_bucket_of_a_several_bucket_model_is_the_global_mean(ranks):
    """Uneven batches (6 and 2 rows) over 1.3 MB of parameters in several buckets."""
    parts = [[U.uneven_batch(rank, k) for k in range(U.STEPS)] for rank in range(2)]
    inputs = [torch.cat([parts[0][k][0], parts[1][k][0]]) for k in range(U.STEPS)]
    targets = [torch.cat([parts[0][k][1], parts[1][k][1]]) for k in range(U.STEPS)]
    net = U.wide_model(seed=0)
    # SGD: Adam's step would blow a gradient's last-bit rounding up to its learning rate
    optimizer = U.optimizer("sgd", net.parameters())
    losses = []
    for x, y in zip(inputs, targets, strict=True):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    for r in ranks:
        got, collectives = r["buckets"]
        assert_same(got, (losses, U.params(net)))
        assert collectives >= 2 * U.STEPS  # several buckets, each an all-reduce


def reference_uneven(make, batch, opt="sgd"):
    """One process on both ranks' uneven batches (UNEVEN_ROWS) together."""
    parts = [[batch(rank, k) for k in range(U.STEPS)] for rank in range(2)]
    net = make(seed=0)
    optimizer = U.optimizer(opt, net.parameters())
    losses = []
    for k in range(U.STEPS):
        x = torch.cat([parts[0][k][0], parts[1][k][0]])
        y = torch.cat([parts[0][k][1], parts[1][k][1]])
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, U.params(net)


def test_a_model_with_a_sparse_gradient_sums_its_rows_apart_and_meets_the_law(ranks):
    want = reference_uneven(U.bag_model, U.bag_batch)
    by_hand = ranks[0]["collectives"][1]
    for r in ranks:
        got, collectives = r["sparse"]
        assert_same(got, want)
        assert collectives >= (by_hand + 2) * U.STEPS  # its buckets, the rows and the loss


def test_a_ddp_over_its_own_process_group_reduces_on_that_group(ranks):
    x, y = U.batches(2)
    want = reference("module", "sgd", x, y)
    for r in ranks:
        got, on_world, on_group = r["subgroup"]
        assert_same(got, want)
        assert on_world == 0 and on_group >= U.STEPS  # nothing on the default group


@pytest.mark.parametrize("name", ["alone/dense", "alone/sparse"])
def test_a_ddp_of_one_rank_steps_on_that_ranks_rows_alone(ranks, name):
    """Groups of one: each rank's learner is a plain step on its own rows (rows, loss and
    scaling from the DDP's group, not the default one), with or without the hook."""
    make, batch = (U.wide_model, U.uneven_batch) if name == "alone/dense" else (
        U.bag_model, U.bag_batch
    )  # fmt: skip
    for rank, r in enumerate(ranks):
        net = make(seed=0)
        optimizer = U.optimizer("sgd", net.parameters())
        losses = []
        for k in range(U.STEPS):
            x, y = batch(rank, k)
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        assert_same(r[name], (losses, U.params(net)))


def test_the_rows_ride_exactly_whatever_the_losss_dtype():
    """257 rows are 256 in bfloat16: the row count rides in float64 until the bucket."""
    from dualtrain_torch.distributed.learner import _Riders

    riders = _Riders(None)
    riders.carry(torch.tensor(257), torch.tensor(3.25, dtype=torch.bfloat16))
    assert riders.carried is not None and riders.carried.tolist() == [257.0, 3.25]


def test_a_hand_written_ddp_loop_on_a_synced_model_meets_the_same_law(ranks):
    x, y = U.batches(2)
    _, want = reference("module", "sgd", x, y)
    for r in ranks:
        for name, value in want.items():
            np.testing.assert_allclose(r["manual"][name], value, **TOL)


def test_a_masked_step_is_the_mean_over_every_ranks_valid_rows(ranks):
    """Pad-and-mask: ranks hold 5 and 3 rows, 3 and 1 of them valid: the mean over the 4."""
    inputs, targets = [], []
    for k in range(U.STEPS):
        parts = [U.masked_batch(rank, k) for rank in range(2)]
        inputs.append(torch.cat([x[m] for x, _, m in parts]))
        targets.append(torch.cat([y[m] for _, y, m in parts]))
    want = reference("module", "sgd", inputs, targets)
    for r in ranks:
        assert_same(r["masked"], want)


def test_a_mean_loss_over_unequal_batches_is_the_global_mean(ranks):
    inputs, targets = [], []
    for k in range(U.STEPS):
        parts = [U.uneven_batch(rank, k) for rank in range(2)]
        inputs.append(torch.cat([x for x, _ in parts]))
        targets.append(torch.cat([y for _, y in parts]))
    want = reference("module", "adam", inputs, targets, loss=U.mean_loss)
    for r in ranks:
        assert_same(r["uneven"], want)


def test_a_rank_with_no_rows_leaves_the_mean_loss_to_the_others(ranks):
    """A 0-d mean over no rows is NaN; it once made every rank's loss NaN."""
    parts = [U.uneven_batch(0, k) for k in range(U.STEPS)]
    want = reference("module", "adam", *zip(*parts, strict=True), loss=U.mean_loss)
    for r in ranks:
        assert_same(r["empty"], want)


def test_reduce_refuses_layouts_that_differ_across_ranks_on_every_rank(ranks):
    """Keys in another order once summed 'a' with 'b' silently; other mismatches hung
    until the timeout or aborted gloo. The run went on (the laws after it hold)."""
    for r in ranks:
        assert r["mismatch"].startswith("value must have the same structure, keys")
        assert "rank 0: {'a': float64[], 'b': float64[]}" in r["mismatch"]
        assert "rank 1: {'b': float64[], 'a': float64[]}" in r["mismatch"]


def _numpy(value):
    return value[2] if isinstance(value, tuple) and value[:1] == ("torch",) else value


@pytest.mark.parametrize("how", ["mean", "sum"])
def test_reduce_equals_numpy_over_the_ranks_values(ranks, how):
    values = [U.reduce_value(rank) for rank in range(2)]
    np_reduce = np.mean if how == "mean" else np.sum

    def want(pick):
        leaves = [np.asarray(pick(v)) for v in values]
        return np_reduce(np.stack(leaves), axis=0)

    for r in ranks:
        got = r[how]
        assert set(got) == set(values[0])
        for name in ("tensor", "ints", "float", "int", "array", "scalar"):
            expected = want(lambda v, name=name: v[name])
            value = _numpy(got[name])
            np.testing.assert_allclose(value, expected, rtol=1e-6, err_msg=name)
            assert np.asarray(value).dtype == expected.dtype, name  # NumPy's dtypes
        # each comes back in the kind it came in
        assert got["tensor"][:2] == ("torch", "float32")
        assert got["ints"][:2] == ("torch", "float64" if how == "mean" else "int64")
        assert type(got["float"]) is float
        assert type(got["int"]) is (float if how == "mean" else int)
        assert isinstance(got["array"], np.ndarray)
        assert isinstance(got["scalar"], np.float32)
        array, (tensor,) = got["nested"]
        np.testing.assert_allclose(array, want(lambda v: v["nested"][0]))
        np.testing.assert_allclose(tensor[2], want(lambda v: v["nested"][1][0]))
        assert r["unchanged"]  # reduced on a copy, not in place


def test_no_sync_accumulates_locally_and_the_next_backward_reduces_it_all(ranks):
    x, y = U.batches(2)
    net = U.model("module", seed=0)
    for k in range(3):  # the reference: the gradient of each global micro-batch's mean, summed
        F.cross_entropy(net(x[k]), y[k]).backward()
    want = net[0].weight.grad.numpy()
    assert not np.allclose(ranks[0]["local_grad"], ranks[1]["local_grad"])  # not reduced yet
    for r in ranks:
        np.testing.assert_allclose(r["accumulated_grad"], want, **TOL)


# ---- a world of one process, in this process ----------------------------------------------


@pytest.fixture
def runtime():
    """A joined world of one (gloo, in-memory store), left after the test."""
    steps = []
    rt = join(World(), timeout=30, steps=Steps(lambda: steps.append(1)))
    rt.counted = steps  # type: ignore[attr-defined]
    try:
        yield rt
    finally:
        rt.leave()


def _net(seed, features, classes):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 6), nn.Tanh(), nn.Linear(6, classes))


# One joined world for all of a test's examples (the fixture is the same for each).
ONE_JOIN = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@ONE_JOIN
@given(
    seed=st.integers(0, 2**16),
    rows=st.integers(1, 6),
    features=st.integers(1, 4),
    classes=st.integers(2, 4),
    lr=st.floats(1e-3, 0.5),
    adam=st.booleans(),
)
def test_world_of_one_learner_step_is_a_plain_step(
    runtime, seed, rows, features, classes, lr, adam
):
    net = _net(seed, features, classes)
    ref = copy.deepcopy(net)
    kind = torch.optim.Adam if adam else torch.optim.SGD
    learner = runtime.learner(net, kind(net.parameters(), lr=lr), None, "jit")
    ref_opt = kind(ref.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(2):
        x = torch.randn(rows, features, generator=g)
        y = torch.randint(0, classes, (rows,), generator=g)
        loss = learner.step(x, y)
        ref_opt.zero_grad()
        want = F.cross_entropy(ref(x), y)
        want.backward()
        ref_opt.step()
        torch.testing.assert_close(loss, want.detach(), **TOL)
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, **TOL)


@ONE_JOIN
@given(seed=st.integers(0, 2**16), mask=st.lists(st.booleans(), min_size=1, max_size=8))
def test_world_of_one_masked_mean_is_the_mean_of_the_valid_rows(runtime, seed, mask):
    mask_t = torch.tensor(mask)
    net = _net(seed, 3, 2)
    ref = copy.deepcopy(net)
    learner = runtime.learner(net, torch.optim.SGD(net.parameters(), lr=0.1), None, "jit")
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(len(mask), 3, generator=g), torch.randint(0, 2, (len(mask),), generator=g)
    x[~mask_t] = 1e3  # padding: it must not count
    loss = learner.step(x, y, mask=mask_t)
    if not any(mask):  # nothing valid anywhere: no gradient, a zero loss
        assert float(loss) == 0.0
        for a, b in zip(net.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a, b)
        return
    want = F.cross_entropy(ref(x[mask_t]), y[mask_t])
    want.backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    torch.testing.assert_close(loss, want.detach(), **TOL)
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, **TOL)


@ONE_JOIN
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=5), st.booleans())
def test_world_of_one_reduce_is_the_value_itself(runtime, values, aggregate):
    array = np.asarray(values, np.float32)
    tensor = torch.tensor(values, dtype=torch.float64)
    out = runtime.reduce({"a": array, "t": [tensor, values[0]]}, aggregate=aggregate)
    np.testing.assert_array_equal(out["a"], array)
    torch.testing.assert_close(out["t"][0], tensor)
    assert out["t"][1] == values[0]


def _masked_round(seed):
    """One join, one masked step checked against plain torch, one leave."""
    rt = join(World(), timeout=30, steps=Steps(lambda: None))
    try:
        mask = torch.arange(seed % 7 + 1) % 3 != 1
        net = _net(seed, 3, 2)
        ref = copy.deepcopy(net)
        learner = rt.learner(net, torch.optim.SGD(net.parameters(), lr=0.1), None, "jit")
        g = torch.Generator().manual_seed(seed)
        x, y = (
            torch.randn(len(mask), 3, generator=g),
            torch.randint(0, 2, (len(mask),), generator=g),
        )
        loss = learner.step(x, y, mask=mask)
        want = F.cross_entropy(ref(x[mask]), y[mask])
        want.backward()
        torch.optim.SGD(ref.parameters(), lr=0.1).step()
        torch.testing.assert_close(loss, want.detach(), **TOL)
    finally:
        rt.leave()


@ONE_JOIN
@given(
    seed=st.integers(0, 2**16),
    targets=st.lists(st.sampled_from([0, 1, 2, -100]), min_size=1, max_size=7),
)
def test_a_world_of_one_loss_is_the_several_process_formula(runtime, seed, targets):
    """The loss is the sum of per-row losses over all rows, as several processes compute
    it: an ignored target (-100) is a row of loss 0, not a row left out of the mean."""
    net = _net(seed, 4, 3)
    ref = copy.deepcopy(net)
    learner = runtime.learner(net, torch.optim.SGD(net.parameters(), lr=0.1), None, "jit")
    x = torch.randn(len(targets), 4, generator=torch.Generator().manual_seed(seed))
    y = torch.tensor(targets)
    loss = learner.step(x, y)
    want = F.cross_entropy(ref(x), y, reduction="none").sum() / len(targets)
    want.backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    torch.testing.assert_close(loss, want.detach(), **TOL)
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_a_world_of_one_refuses_sequence_outputs_as_several_processes_do(runtime):
    net = nn.Conv1d(4, 3, 1)  # (B, 4, T) -> (B, 3, T): per-row losses would be (B, T)
    learner = runtime.learner(net, torch.optim.SGD(net.parameters(), lr=0.1), None, "jit")
    with pytest.raises(ShapeError, match=r"per-sample losses \(B,\) or a 0-d mean"):
        learner.step(torch.randn(2, 4, 5), torch.zeros(2, 5, dtype=torch.long))


def test_rounds_of_join_step_leave_in_a_world_of_one_match_plain_torch():
    for seed in range(10):
        _masked_round(seed)
    assert not dist.is_initialized()


def test_multiverse_of_one_runs_in_this_process():
    def universe(mv, scale):
        net = U.model("craft", seed=0)
        learner = mv.learner(net, U.optimizer("sgd", net.parameters()))
        x, y = U.batches(1)
        return [float(learner.step(x[k], y[k])) * scale for k in range(U.STEPS)], mv.step

    losses, steps = dualtrain.Multiverse(universe, 1, backend="torch")(1.0)
    x, y = U.batches(1)
    np.testing.assert_allclose(losses, reference("craft", "sgd", x, y)[0], **TOL)
    assert steps == U.STEPS
    assert not dist.is_initialized()  # mv() left the run


def test_a_world_of_one_makes_no_group_and_leave_is_idempotent():
    first = join(World(), timeout=30, steps=Steps(lambda: None))
    second = join(World(), timeout=30, steps=Steps(lambda: None))
    assert not dist.is_initialized() and second.nworld == first.nworld == 1
    assert first.backend is None and first.rank == 0
    second.leave()
    second.leave()
    first.leave()
    assert not dist.is_initialized()


def test_a_group_the_script_made_is_checked_and_left_to_it():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ArgumentError, match="rank 0 of 1; world says rank 1 of 2"):
            join(World(processes=2, rank=1, master_port=1), timeout=30, steps=Steps(lambda: None))
        rt = join(World(), timeout=30, steps=Steps(lambda: None))
        assert rt.reduce(2.0, aggregate=True) == 2.0
        assert isinstance(rt.sync_model(_net(0, 3, 2), {}), SoloModule)  # one process: no DDP
        rt.leave()
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("world", "timeout", "on_step", "named"),
    [
        ("local", 30, print, "world"),
        (World(processes=2, rank=2), 30, print, "world"),
        (World(), 0, print, "timeout"),
        (World(), True, print, "timeout"),
        (World(), 30, None, "on_step"),
    ],
)
def test_join_refuses_bad_arguments_before_joining(world, timeout, on_step, named):
    with pytest.raises(ArgumentError, match=f"^{named} must be"):
        join(world, timeout=timeout, steps=Steps(on_step))
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"bucket_size": 25}, "option must be one of 'bucket_cap_mb'.*got option='bucket_size'"),
        ({"bucket_cap_mb": -1}, "bucket_cap_mb must be a positive number"),
        ({"broadcast_buffers": 1}, "broadcast_buffers must be a bool"),
    ],
)
def test_a_bad_sync_option_is_named(runtime, options, named):
    with pytest.raises(ArgumentError, match=named):
        runtime.sync_model(_net(0, 3, 2), options)


def test_a_world_of_one_syncs_without_ddp_and_keeps_ddps_surface(runtime):
    """No DDP, no gradient hook: the grads are the plain model's; `module.` keys as DDP's,
    so an anchor of a run of one loads into a run of two."""
    net = _net(0, 3, 2)
    ref = copy.deepcopy(net)
    synced = runtime.sync_model(net, {"bucket_cap_mb": 1, "find_unused_parameters": True})
    assert type(synced) is SoloModule and synced.module is net
    assert not isinstance(synced, nn.parallel.DistributedDataParallel)
    assert runtime.sync_model(synced, {}) is synced  # already synced: as it is
    assert list(synced.state_dict()) == [f"module.{k}" for k in net.state_dict()]
    assert not net._forward_hooks and not net._forward_pre_hooks
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    with runtime.no_sync(synced):
        assert synced.require_backward_grad_sync is False
        F.cross_entropy(synced(x), y).backward()
    assert synced.require_backward_grad_sync is True
    F.cross_entropy(ref(x), y).backward()
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_a_bad_engine_or_optimizer_is_refused(runtime):
    net = _net(0, 3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ArgumentError, match=r"^engine must be 'jit'.*got engine='pmap'"):
        runtime.learner(net, opt, None, "pmap")
    other = torch.optim.SGD(_net(1, 3, 2).parameters(), lr=0.1)
    with pytest.raises(ArgumentError, match=r"^optimizer must be an optimizer over the model"):
        runtime.learner(net, other, None, "jit")
    with pytest.raises(ArgumentError, match=r"^optimizer must be a torch.optim.Optimizer"):
        runtime.learner(net, "sgd", None, "jit")
    with pytest.raises(ArgumentError, match=r"^model must be a torch.nn.Module"):
        runtime.sync_model("net", {})


def test_a_bad_mask_or_loss_shape_is_refused(runtime):
    net = _net(0, 3, 2)
    learner = runtime.learner(net, torch.optim.SGD(net.parameters(), lr=0.1), None, "jit")
    x, y = torch.randn(4, 3), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ShapeError, match=r"mask must be bool of the losses' shape \(4,\)"):
        learner.step(x, y, mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ShapeError, match="mask must be bool"):
        learner.step(x, y, mask=torch.ones(4))
    mean = runtime.learner(net, learner.optimizer, U.mean_loss, "jit")
    with pytest.raises(ArgumentError, match=r"^mask must be None when loss_fn returns a 0-d"):
        mean.step(x, y, mask=torch.ones(4, dtype=torch.bool))
    matrix = runtime.learner(net, learner.optimizer, lambda o, t: o, "jit")
    with pytest.raises(ShapeError, match=r"per-sample losses \(B,\) or a 0-d mean; got"):
        matrix.step(x, y)


def test_a_learner_step_inside_no_sync_is_refused(runtime):
    """Inside no_sync nothing is reduced: the step would apply each rank's own gradient
    and the replicas would part silently. Nothing changes before the refusal."""
    net = _net(0, 3, 2)
    before = copy.deepcopy(net.state_dict())
    learner = runtime.learner(net, torch.optim.SGD(net.parameters(), lr=0.1), None, "jit")
    x, y = torch.randn(4, 3), torch.zeros(4, dtype=torch.long)
    with runtime.no_sync(learner.model), pytest.raises(ArgumentError, match=r"outside mv\.no_sync"):
        learner.step(x, y)
    for name, value in net.state_dict().items():
        torch.testing.assert_close(value, before[name])
    assert learner.steps == 0
    learner.step(x, y)  # after it, steps go on
    assert learner.steps == 1


@ONE_JOIN
@given(seed=st.integers(0, 2**16), adam=st.booleans())
def test_world_of_one_mean_loss_of_an_empty_batch_is_zero_and_moves_nothing(runtime, seed, adam):
    net = _net(seed, 3, 2)
    before = copy.deepcopy(net.state_dict())
    kind = torch.optim.Adam if adam else torch.optim.SGD
    learner = runtime.learner(net, kind(net.parameters(), lr=0.1), U.mean_loss, "jit")
    loss = learner.step(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    assert float(loss) == 0.0  # was NaN: the mean of no rows
    for name, value in net.state_dict().items():
        torch.testing.assert_close(value, before[name])


def test_reduce_refuses_a_leaf_it_cannot_reduce(runtime):
    with pytest.raises(ArgumentError, match=r"^value must be a number, a torch tensor"):
        runtime.reduce({"ok": 1.0, "bad": "text"}, aggregate=False)
    with pytest.raises(ArgumentError, match=r"^value must be"):
        runtime.reduce(np.array(["a"]), aggregate=False)


def test_steps_are_counted_once_each(runtime):
    net = U.model("craft", seed=0)
    synced = runtime.sync_model(net, {})
    x = torch.randn(2, U.FEATURES)
    synced(x)  # training mode: a step
    synced.eval()
    synced(x)  # evaluation: not a step
    synced.train()
    learner = runtime.learner(synced, torch.optim.SGD(net.parameters(), lr=0.1), None, "jit")
    learner.step(x, torch.zeros(2, dtype=torch.long))  # one step, not one plus its forward
    assert len(runtime.counted) == 2
    assert learner.steps == 1


def test_the_synced_module_answers_for_the_module(runtime):
    net = U.model("craft", seed=0)
    synced = runtime.sync_model(net, {})
    assert isinstance(synced, SoloModule) and isinstance(runtime, TorchRuntime)
    assert synced.fc1 is net.fc1  # forwarded to the wrapped module
    assert runtime.unwrap(synced) is net and runtime.unwrap(net) is net
    with pytest.raises(AttributeError):
        synced.no_such_attribute  # noqa: B018
    assert runtime.gather_object({"a": 1}) == [{"a": 1}]
    runtime.barrier()
    assert runtime.seed(5) == 5 and torch.initial_seed() == 5
    with pytest.raises(ArgumentError, match=r"^model must be a model returned by sync"):
        runtime.no_sync(net)
    assert runtime.batch_device("torch") is None and runtime.batch_device("numpy") is None
    with pytest.raises(ArgumentError, match=r"^to must be one of"):
        runtime.batch_device("cupy")


@pytest.mark.gpu
def test_a_world_of_one_on_cuda_moves_inputs_to_its_device_as_ddp_does():
    rt = join(World(), timeout=30, steps=Steps(lambda: None))
    try:
        synced = rt.sync_model(_net(0, 3, 2), {})
        assert type(synced) is SoloModule
        out = synced(torch.randn(4, 3))  # a CPU batch, as DDP with device_ids takes it
        assert out.device == rt.device == torch.device("cuda", 0)
    finally:
        rt.leave()


@pytest.mark.gpu
def test_a_world_of_one_puts_the_process_on_its_cuda_device():
    rt = join(World(), timeout=30, steps=Steps(lambda: None))
    try:
        # One process: no group (nccl is for several), the device is cuda:<local_rank>.
        assert rt.backend is None and rt.device == torch.device("cuda", 0)
        assert rt.batch_device("torch") == torch.device("cuda", 0)
        assert rt.batch_device("numpy") is None
        net = U.model("module", seed=0)
        learner = rt.learner(net, U.optimizer("adam", net.parameters()), None, "jit")
        assert next(learner.model.parameters()).device == torch.device("cuda", 0)
        x, y = U.batches(1)
        losses = [float(learner.step(x[k], y[k])) for k in range(U.STEPS)]  # CPU in, moved
        want = reference("module", "adam", x, y)
        np.testing.assert_allclose(losses, want[0], rtol=1e-4)
        out = rt.reduce({"t": torch.ones(2, device="cuda"), "f": 1.5}, aggregate=True)
        assert out["t"].device.type == "cuda" and out["f"] == 1.5
    finally:
        rt.leave()


def _options_and_checkpoint(mv: dualtrain.Multiverse, folder: str) -> dict:
    import dualtrain_torch
    from tests.multiverse.framework_universes import TwoLayer

    model = dualtrain_torch.realize(TwoLayer(), seed=0)
    learner = mv.learner(model, torch.optim.SGD(model.parameters(), lr=0.1))
    path = dualtrain.TimeMachine(save_path=folder).drop(learner.model)  # not mv.time_machine
    fresh = dualtrain_torch.realize(TwoLayer(), seed=5)
    skipped = dualtrain.TimeMachine().to(fresh, path, frozen=True)
    same = all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True)
    )
    return {"wrapper": type(learner.model).__name__, "skipped": list(skipped), "same": same}


def test_a_world_of_one_takes_the_ddp_options_and_time_machine_unwraps_its_model(tmp_path):
    mv = dualtrain.Multiverse(_options_and_checkpoint, 1, find_unused_parameters=True)
    assert mv(str(tmp_path)) == {"wrapper": "SoloModule", "skipped": [], "same": True}
