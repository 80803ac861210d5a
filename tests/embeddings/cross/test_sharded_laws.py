"""Laws of a sharded store, over thread ranks (tests.embeddings.ranks), under both frameworks.

K steps on a store sharded over W processes equal K steps of one process on the union of
their batches with the sum of their losses; rows no rank touched never change; every row
starts as the unsharded store's row. Batches differ in size between ranks and may be empty.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import dualtrain
from dualtrain.embeddings import split
from tests.embeddings.ranks import OPTIMIZERS, attach, gathered, losses, run_ranks, shard, union
from tests.embeddings.runs import DIM, ROWS, SEED, store
from tests.embeddings.sharded_universes import step


def ids_of(size: int) -> st.SearchStrategy:
    return st.lists(st.integers(0, ROWS - 1), min_size=0, max_size=size).map(
        lambda v: np.array(v, np.int64)
    )


@st.composite
def sharded_steps(draw: st.DrawFn) -> tuple[int, list[list[np.ndarray]]]:
    """A world size and, per step, each rank's ids (any sizes, empty included)."""
    world = draw(st.integers(1, 3))
    count = draw(st.integers(1, 4))
    steps = [[draw(ids_of(9)) for _ in range(world)] for _ in range(count)]
    return world, steps


def train(framework, rows, batches):
    """Steps `rows` through `batches` [(ids, weights)]; settles and flushes."""
    for ids, weights in batches:
        step(framework, rows, ids, weights)
    rows.settle()
    rows.flush()


def sharded(framework, name, mode, world, steps, prefetch=False, ahead=False):
    def body(rank, exchange):
        s = shard(rank, exchange)
        rows = attach(framework, name, mode, s)
        mine = [steps[k][rank] for k in range(len(steps))]
        for k, ids in enumerate(mine):
            ahead = mine[k + 1] if prefetch and k + 1 < len(mine) else None
            step(framework, rows, ids, losses(k, rank, len(ids)), ahead)
        rows.settle()
        rows.flush()
        return s

    return gathered(run_ranks(world, body, ahead=ahead))


def single(framework, name, mode, world, steps):
    s = store()
    rows = attach(framework, name, mode, s)
    ids, weights = union(steps, world)
    train(framework, rows, zip(ids, weights, strict=True))
    return {"weight": s.table, **s.state}


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["lazy", "exact"])
@settings(max_examples=8, deadline=None)
@given(case=sharded_steps())
def test_sharded_steps_equal_one_process_on_the_union_with_the_summed_loss(
    framework, name, mode, case
):
    world, steps = case
    got = sharded(framework, name, mode, world, steps)
    want = single(framework, name, mode, world, steps)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
    touched = np.zeros(ROWS, bool)
    for per_rank in steps:
        for ids in per_rank:
            touched[ids] = True
    if mode == "lazy":  # rows no rank touched are the initial table's, bit for bit
        np.testing.assert_array_equal(got["weight"][~touched], store().table[~touched])


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("channel", ["own channel", "one channel"])
@settings(max_examples=6, deadline=None)
@given(case=sharded_steps(), mode=st.sampled_from(["lazy", "exact"]))
def test_prefetch_changes_nothing(framework, channel, case, mode):
    """Routed ahead on a second channel from a thread (torch's way) or at the call (JAX's)."""
    world, steps = case
    plain = sharded(framework, "adam", mode, world, steps)
    ahead = sharded(
        framework, "adam", mode, world, steps, prefetch=True, ahead=channel == "own channel"
    )
    for key in plain:
        np.testing.assert_array_equal(ahead[key], plain[key], err_msg=key)


@settings(max_examples=40, deadline=None)
@given(
    num_rows=st.integers(1, 3 * 4096 + 7),
    world=st.integers(1, 5),
    init=st.sampled_from(["normal", "uniform", "zeros"]),
)
def test_every_row_starts_as_the_unsharded_stores_row(num_rows, world, init):
    whole = dualtrain.EmbeddingStore(num_rows, 2, init=init, std=0.3, seed=SEED).table
    bounds = split(num_rows, world)
    assert bounds[0] == 0 and bounds[-1] == num_rows
    assert np.all(np.diff(bounds) >= num_rows // world)
    assert np.all(np.diff(bounds) <= -(-num_rows // world))

    class Quiet:  # making a shard exchanges nothing
        rank, world = 0, 1

        def all_to_all(self, parts):
            raise AssertionError("no exchange at sharding")

    parts = []
    for rank in range(world):
        s = dualtrain.EmbeddingStore(num_rows, 2, init=init, std=0.3, seed=SEED)
        s.make_shard(rank, world, Quiet())
        if s.shard is not None:  # every id of its range, and none other, is its own
            ids = np.arange(num_rows)
            assert np.array_equal(np.flatnonzero(s.shard.owner(ids) == rank), np.array(s.rows))
        assert not s.allocated  # sharding allocates nothing
        assert s.rows == range(int(bounds[rank]), int(bounds[rank + 1]))
        parts.append(s.table)
        assert s.memory().table == len(s.rows) * 2 * 4
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_a_callable_init_sees_global_ids():
    def init(rows, rng):
        return np.repeat(rows[:, None].astype(np.float64), DIM, axis=1)

    def body(rank, exchange):
        s = dualtrain.EmbeddingStore(ROWS, DIM, init=init)
        s.make_shard(rank, exchange.world, exchange)
        return s.table[:, 0]

    got = np.concatenate(run_ranks(3, body))
    np.testing.assert_array_equal(got, np.arange(ROWS))


def test_a_table_allocated_before_the_sync_keeps_its_rows():
    def body(rank, exchange):
        s = store()
        before = s.table.copy()
        s.make_shard(rank, exchange.world, exchange)
        return before, s

    (before, first), (_, second) = run_ranks(2, body)
    np.testing.assert_array_equal(np.concatenate([first.table, second.table]), before)
    assert first.stats()["rows"] == (0, ROWS // 2) and second.stats()["world"] == 2


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_an_attached_or_sharded_store_is_refused(framework):
    def body(rank, exchange):
        s = shard(rank, exchange)
        with pytest.raises(dualtrain.ArgumentError, match="already a shard"):
            s.make_shard(rank, exchange.world, exchange)
        t = store()
        attach(framework, "sgd", "lazy", t)
        with pytest.raises(dualtrain.ArgumentError, match="before attaching"):
            t.make_shard(rank, exchange.world, exchange)
        return True

    assert run_ranks(2, body) == [True, True]


def test_ids_outside_the_table_are_refused_in_the_first_exchange_and_move_no_row():
    def body(rank, exchange):
        rows = attach("torch", "sgd", "lazy", shard(rank, exchange))
        calls, traffic = exchange.calls, rows.shard.traffic.calls
        with pytest.raises(dualtrain.ArgumentError, match=f"row id {ROWS}"):
            rows.fetch(np.array([0, ROWS]))  # every rank's own error: each refused its ids
        assert exchange.calls == calls + 1  # the lengths, carrying the refusal
        assert rows.shard.traffic.calls == traffic  # no ids, rows or gradients moved
        return True

    assert run_ranks(2, body) == [True, True]


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_shard_trains_as_one_process(framework, dtype):
    """Rows travel as their bytes; each owner adds the ranks' gradients in float32."""
    steps = [[np.array([1, 3, 3]), np.array([3, 2])], [np.array([0]), np.array([], np.int64)]]

    def run(world):
        def body(rank, exchange):
            s = dualtrain.EmbeddingStore(4, DIM, dtype=dtype, std=0.5, seed=SEED)
            if world > 1:
                s.make_shard(rank, world, exchange)
            rows = attach(framework, "sgd", "lazy", s)
            for k, per_rank in enumerate(steps):
                ids = per_rank[rank] if world > 1 else np.concatenate(per_rank)
                w = (
                    losses(k, rank, len(ids))
                    if world > 1
                    else np.concatenate([losses(k, r, len(per_rank[r])) for r in range(2)])
                )
                step(framework, rows, ids, w)
            rows.flush()
            return s

        return gathered(run_ranks(world, body))["weight"].astype(np.float32)

    np.testing.assert_allclose(run(2), run(1), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_more_ranks_than_rows(framework):
    """A rank whose range is empty holds no rows and still takes part in every step."""

    def body(rank, exchange):
        s = dualtrain.EmbeddingStore(2, DIM, std=0.5, seed=SEED)
        s.make_shard(rank, exchange.world, exchange)
        rows = attach(framework, "adam", "exact", s)
        for k in range(2):
            ids = np.array([1, 0, 1]) if rank == 2 else np.array([], np.int64)
            step(framework, rows, ids, losses(k, rank, len(ids)))
        rows.settle()
        rows.flush()
        return s

    stores = run_ranks(3, body)
    assert [len(s.rows) for s in stores] == [1, 1, 0]
    single = dualtrain.EmbeddingStore(2, DIM, std=0.5, seed=SEED)
    rows = attach(framework, "adam", "exact", single)
    for k in range(2):
        step(framework, rows, np.array([1, 0, 1]), losses(k, 2, 3))
    rows.flush()
    np.testing.assert_allclose(gathered(stores)["weight"], single.table, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_threads_of_each_rank_lose_no_update(framework):
    """Two threads a rank train one shard: fetch to step is one unit a process.

    The loss is linear in the rows, so SGD's result is the initial table minus lr times
    every gradient of every thread of every rank, whatever order the units ran in.
    """
    threads, per_thread, world = 2, 3, 2
    rng = np.random.default_rng(5)
    batches = rng.integers(0, ROWS, (world, threads, per_thread, 6))

    def body(rank, exchange):
        rows = attach(framework, "sgd", "lazy", shard(rank, exchange))

        def worker(t):
            for k in range(per_thread):
                ids = batches[rank, t, k]
                w = np.ones((len(ids), DIM), np.float32)
                e = rows.fetch(ids)
                if framework == "torch":
                    (e * torch.from_numpy(w)).sum().backward()
                    rows.step()
                else:
                    rows.step(jax.grad(lambda e, w=w: (e * w).sum())(e))

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        rows.flush()
        assert rows.steps == threads * per_thread
        return rows.store

    got = gathered(run_ranks(world, body))["weight"]
    want = store().table.copy()
    np.subtract.at(want, batches.ravel(), 0.1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_thread_without_a_batch_enters_no_exchange():
    def body(rank, exchange):
        rows = attach("torch", "sgd", "lazy", shard(rank, exchange))
        calls = exchange.calls
        with pytest.raises(dualtrain.ArgumentError, match="fetch"):
            rows.step()
        rows.release()  # nothing open: nothing happens
        assert exchange.calls == calls
        return True

    assert run_ranks(2, body) == [True, True]


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("ahead", [False, True])
def test_a_prefetch_one_rank_does_not_use_is_dropped_by_every_rank(framework, ahead):
    """Each rank decides alone whether its prefetch matches; they agree before routing."""
    steps = [[np.array([1, 7]), np.array([2, 3])], [np.array([4]), np.array([5, 6])]]
    prefetched = [np.array([2, 3]), np.array([5, 6])]  # rank 0's guess is wrong

    def body(rank, exchange):
        rows = attach(framework, "sgd", "lazy", shard(rank, exchange))
        for k, per_rank in enumerate(steps):
            ids = per_rank[rank]
            e = rows.fetch(ids)
            if k == 0:
                rows.prefetch(prefetched[rank])
            w = losses(k, rank, len(ids))
            if framework == "torch":
                ((e * torch.from_numpy(w)).sum() + 0.5 * (e**2).sum()).backward()
                rows.step()
            else:
                rows.step(jax.grad(lambda e, w=w: (e * w).sum() + 0.5 * (e**2).sum())(e))
        rows.flush()
        return rows.store

    got = gathered(run_ranks(2, body, ahead=ahead))
    want = single(framework, "sgd", "lazy", 2, steps)
    np.testing.assert_allclose(got["weight"], want["weight"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("where", ["fetch", "prefetch"])
@pytest.mark.parametrize("ahead", [False, True])
def test_ids_one_rank_refuses_stop_every_rank_and_training_goes_on(where, ahead):
    """A bad id on one rank: it raises its error, the others an ArgumentError naming it;
    no rank is left in an exchange, and the next batches pair up as before."""

    def body(rank, exchange):
        rows = attach("torch", "sgd", "lazy", shard(rank, exchange))
        bad = np.array([0, ROWS + 3]) if rank == 1 else np.array([0])
        errors = []
        calls = [rows.fetch] if where == "fetch" else [rows.prefetch, rows.fetch]
        for call in calls:
            # A prefetch routed at the call raises there on every rank; one routed on its
            # own channel raises at the fetch that takes it (the refusing rank: at both).
            try:
                call(bad if call == calls[0] else np.array([2]))
            except dualtrain.ArgumentError as err:
                errors.append(str(err))
            rows.release()
        assert errors
        message = errors[0]
        assert (f"row id {ROWS + 3}" in message) if rank == 1 else ("rank(s) [1]" in message)
        e = rows.fetch(np.array([rank, 5]))
        (e * torch.ones_like(e)).sum().backward()
        rows.step()
        rows.flush()
        return rows.store

    got = gathered(run_ranks(2, body, ahead=ahead))["weight"]
    want = store().table.copy()
    np.subtract.at(want, [0, 5, 1, 5], 0.1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_detached_stores_state_is_cut_to_the_shard_too(framework):
    def body(rank, exchange):
        s = store()
        rows = attach(framework, "adam", "exact", s)
        rows.detach()
        s.make_shard(rank, exchange.world, exchange)
        assert all(len(t) == len(s.rows) for t in s.state.values())
        assert len(s.counters) == len(s.rows)
        assert s.memory().total == len(s.rows) * (DIM * 4 * 3 + 8)
        return True

    assert run_ranks(2, body) == [True, True]


@pytest.mark.parametrize("ahead", [False, True])
def test_a_jax_prefetch_gathers_its_rows_once(ahead):
    """The owner's rows of a prefetched batch are gathered once, in the background."""
    steps = [np.array([1, 7, 30]), np.array([2, 3, 35]), np.array([4, 22])]

    def body(rank, exchange):
        rows = attach("jax", "sgd", "lazy", shard(rank, exchange))
        session = rows.local.session
        gathers = []
        real = session._gather
        session._gather = lambda batch: (gathers.append(batch.size), real(batch))[1]
        for k, ids in enumerate(steps):
            ahead_ids = steps[k + 1] if k + 1 < len(steps) else None
            step("jax", rows, ids, losses(k, rank, len(ids)), ahead_ids)
        rows.flush()
        return len(gathers)

    assert run_ranks(2, body, ahead=ahead) == [len(steps), len(steps)]


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(["float32", "float16", "int64", "uint8", "bool", "bfloat16"]),
    trail=st.lists(st.integers(0, 3), max_size=2).map(tuple),
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    strided=st.booleans(),
)
def test_wire_round_trips_every_part(dtype, trail, lengths, strided):
    """unpack(pack(part)) == part for any dtype, rows of no bytes and strided parts included."""
    from dualtrain.embeddings.sharding import Wire

    kind = np.dtype(jax.numpy.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(len(lengths))
    parts = []
    for n in lengths:
        whole = rng.integers(0, 100, size=(2 * n, *trail)).astype(kind)
        parts.append(whole[::2] if strided else whole[:n])
    wire = Wire.of(parts)
    for part in parts:
        back = wire.unpack(wire.pack(part))
        assert back.dtype == kind and back.shape == part.shape
        assert np.array_equal(back.view(np.uint8), np.ascontiguousarray(part).view(np.uint8))
