"""Issue 27: a read of the store includes every step already returned, and a checkpoint of
an attachment is never torn by a step on another thread.

Write-backs run on the attachment's worker thread, so `step()` returns before its rows land.
`store.table`, `store.state` and `store.counters` wait for them; without that wait a read
right after a step of a big batch sees rows from before it (most reads did, here).

The threaded checkpoint laws train every 50th row of a big table (small steps, long
writes) with a gradient of 1 and SGD: after k steps each of those rows is exactly -LR * k
and the others 0, so an anchor (or a table after a load) holding rows of two different
steps is caught whatever the interleaving.
"""

from __future__ import annotations

import threading

import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import dualtrain
import dualtrain_jax
import dualtrain_torch
from tests.embeddings.test_threads import _run_threads

FRAMEWORKS = ["torch", "jax"]
MODES = ["lazy", "exact"]
ROWS, DIM, IDS, STEPS, LR = 30_000, 16, 40_000, 8, 0.5  # a batch: ~22,000 unique rows


def _attach(framework: str, store: dualtrain.EmbeddingStore, optimizer: str, mode: str):
    if framework == "torch":
        if optimizer == "sgd":
            return dualtrain_torch.attach(store, torch.optim.SGD, mode, lr=LR)
        return dualtrain_torch.attach(store, torch.optim.Adagrad, mode, lr=LR)
    tx = optax.sgd(LR) if optimizer == "sgd" else optax.adagrad(LR, initial_accumulator_value=0)
    return dualtrain_jax.attach(store, tx, mode)


def _step(framework: str, rows, ids: np.ndarray, prefetch: np.ndarray | None = None) -> None:
    """One step with the loss sum(rows[ids]): each row's gradient is its count in `ids`."""
    emb = rows.fetch(ids)
    if prefetch is not None:
        rows.prefetch(prefetch)
    if framework == "torch":
        emb.sum().backward()
        rows.step()
    else:
        rows.step(jnp.ones_like(emb))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefetch", [False, True])
def test_table_read_after_each_step_equals_dense_sgd(framework, mode, prefetch):
    """Dense SGD from zeros with gradient = count: the table is -LR * counts so far, exactly."""
    store = dualtrain.EmbeddingStore(ROWS, DIM, init="zeros")
    rows = _attach(framework, store, "sgd", mode)
    plan = [np.random.default_rng(k).integers(0, ROWS, IDS) for k in range(STEPS + 1)]
    counts = np.zeros(ROWS, np.float32)
    for k in range(STEPS):
        _step(framework, rows, plan[k], plan[k + 1] if prefetch else None)
        counts += np.bincount(plan[k], minlength=ROWS)
        table = store.table  # no flush: the read itself waits for the write-back
        np.testing.assert_array_equal(table[:, 0], -LR * counts, err_msg=f"after step {k + 1}")
        assert (table == table[:, :1]).all()
    rows.flush()


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("mode", MODES)
def test_state_and_counters_read_after_each_step(framework, mode):
    """Adagrad's sum is the sum of squared gradients so far; exact mode's counters the step."""
    store = dualtrain.EmbeddingStore(ROWS, DIM, init="zeros")
    rows = _attach(framework, store, "adagrad", mode)
    plan = [np.random.default_rng(100 + k).integers(0, ROWS, IDS) for k in range(STEPS)]
    squares = np.zeros(ROWS, np.float32)
    last = np.zeros(ROWS, np.int64)
    for k, ids in enumerate(plan):
        _step(framework, rows, ids)
        count = np.bincount(ids, minlength=ROWS)
        squares += (count**2).astype(np.float32)
        last[count > 0] = k + 1
        np.testing.assert_array_equal(store.state["sum"][:, 0], squares, f"step {k + 1}")
        if mode == "exact":
            np.testing.assert_array_equal(store.counters, last)
        else:
            assert store.counters is None
    rows.flush()


def test_a_read_does_not_change_memory_or_repr():
    """memory() and repr() report sizes only: they neither wait nor change with steps."""
    store = dualtrain.EmbeddingStore(100, 8, init="zeros")
    rows = dualtrain_torch.attach(store, torch.optim.Adam, "exact", lr=0.1)
    before = store.memory()
    _step("torch", rows, np.arange(50))
    assert store.memory() == before
    assert repr(store).startswith("EmbeddingStore(100 x 8 float32, state=['exp_avg'")
    rows.flush()


# ---- checkpoints while other threads train ------------------------------------------------

WIDE, EVERY, THREADS, DROPS = 200_000, 50, 2, 6  # a 12.8 MB table; 4,000 rows a step
TRAINED = np.arange(0, WIDE, EVERY)


def _uniform_step(framework: str, rows) -> None:
    _step(framework, rows, TRAINED)


def _after(steps: int) -> np.ndarray:
    """Each row's value after `steps` steps (rows of the table's first column)."""
    out = np.zeros(WIDE, np.float32)
    out[TRAINED] = -LR * steps
    return out


def _check(store: dualtrain.EmbeddingStore, steps: int, what: str) -> None:
    table = store.table
    np.testing.assert_array_equal(table[:, 0], _after(steps), err_msg=what)
    assert (table == table[:, :1]).all(), what
    if store.counters is not None:
        want = np.zeros(WIDE, np.int64)
        want[TRAINED] = steps
        np.testing.assert_array_equal(store.counters, want, err_msg=what)


def _run(bodies) -> list[BaseException]:
    """Each body in a thread of its own, started together; the errors they raised."""
    return _run_threads(lambda k: bodies[k](), len(bodies))


def _trainer(framework: str, rows, stepped: threading.Event, done: threading.Event):
    """Steps until `done`, setting `stepped` after each: every checkpoint call meets one."""

    def train() -> None:
        try:
            while not done.is_set():
                _uniform_step(framework, rows)
                stepped.set()
        finally:  # a failed thread ends the race rather than leave the others waiting
            done.set()
            stepped.set()

    return train


def _between_steps(calls, stepped: threading.Event, done: threading.Event):
    """Runs each of `calls` once a step has landed since the last, then sets `done`."""

    def run() -> None:
        try:
            for call in calls:
                stepped.wait()
                stepped.clear()
                if done.is_set():  # a training thread failed
                    return
                call()
        finally:
            done.set()

    return run


def _uniform_rows(framework: str, mode: str):
    store = dualtrain.EmbeddingStore(WIDE, DIM, init="zeros")
    rows = _attach(framework, store, "sgd", mode)
    _uniform_step(framework, rows)  # the first step (JAX compiles) outside the race
    return store, rows


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("mode", MODES)
def test_drop_embeddings_while_training_writes_whole_steps(framework, mode, tmp_path):
    """Anchors dropped while two threads train all load back, each holding one whole step."""
    store, rows = _uniform_rows(framework, mode)
    tm = dualtrain.TimeMachine(save_path=tmp_path)
    paths: list = []
    stepped, done = threading.Event(), threading.Event()
    drops = [lambda k=k: paths.append(tm.drop_embeddings(rows, f"emb{k}")) for k in range(DROPS)]
    drop = _between_steps(drops, stepped, done)
    assert _run([_trainer(framework, rows, stepped, done)] * THREADS + [drop]) == []
    _check(store, rows.steps, "the trained table")
    for path in paths:
        again_store, again = _uniform_rows(framework, mode)
        manifest = tm.to_embeddings(again, path)  # every CRC holds
        _check(again_store, manifest["step"], path.name)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_to_embeddings_while_training_loads_between_steps(framework, tmp_path):
    """A load while threads train lands between two steps: every row stays equal to -LR * steps."""
    store, rows = _uniform_rows(framework, "exact")
    tm = dualtrain.TimeMachine(save_path=tmp_path)
    _uniform_step(framework, rows)
    path = tm.drop_embeddings(rows, "emb")
    stepped, done = threading.Event(), threading.Event()
    load = _between_steps([lambda: tm.to_embeddings(rows, path)] * DROPS, stepped, done)
    assert _run([_trainer(framework, rows, stepped, done)] * THREADS + [load]) == []
    _check(store, rows.steps, "the table trained through loads")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_reads_from_other_threads_include_every_returned_step(framework):
    """Readers on other threads (flushing at once) see every step the trainer has returned."""
    store, rows = _uniform_rows(framework, "lazy")
    returned = [rows.steps]  # steps the trainer has returned from, in order
    stepped, done = threading.Event(), threading.Event()
    first = TRAINED[0]

    def read() -> None:
        while not done.is_set():
            stepped.wait()
            k = returned[-1]
            value = store.table[first, 0]  # later steps may have landed too: never fewer
            assert value <= -LR * k, f"read {value} after step {k} returned"

    def train() -> None:
        try:
            for _ in range(40):
                _uniform_step(framework, rows)
                returned.append(rows.steps)
                stepped.set()
        finally:
            done.set()

    assert _run([train, read, read]) == []
    _check(store, rows.steps, "the trained table")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_hold_gives_a_consistent_copy_while_others_train(framework):
    """Inside rows.hold() no step of another thread lands: two reads agree."""
    store, rows = _uniform_rows(framework, "exact")
    stepped, done = threading.Event(), threading.Event()
    seen: list[int] = []

    def copy() -> None:
        with rows.hold():
            a = store.table.copy()
            seen.append(rows.steps)
            b = store.table.copy()
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a[:, 0], _after(seen[-1]))

    hold = _between_steps([copy] * DROPS, stepped, done)
    assert _run([_trainer(framework, rows, stepped, done)] * THREADS + [hold]) == []
    assert len(seen) == DROPS
    _check(store, rows.steps, "the trained table")
