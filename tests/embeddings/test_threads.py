"""One attachment used from several threads: every update lands, no spurious error.

A thread's ``fetch`` opens a batch that the same thread closes with ``step`` (or
``release``); another thread's ``fetch`` waits meanwhile. With plain SGD at lr=1 and a loss
whose gradient is 1 per occurrence, the final table is exactly minus each row's count of
occurrences over every thread's batches, whatever the interleaving.
"""

from __future__ import annotations

import sys
import threading

import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import dualtrain
import dualtrain_jax
import dualtrain_torch
from dualtrain.errors import ArgumentError

THREADS, STEPS, ROWS, DIM = 4, 75, 12, 3  # 300 updates, heavily overlapping rows


def _batches(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, ROWS, size=rng.integers(1, 9)) for _ in range(STEPS)]


def _torch_step(rows, ids: np.ndarray) -> None:
    emb = rows.fetch(ids)
    emb.sum().backward()
    rows.step()


def _jax_step(rows, ids: np.ndarray) -> None:
    emb = rows.fetch(ids)
    rows.step(jnp.ones_like(emb))


def _attach(framework: str, store: dualtrain.EmbeddingStore):
    if framework == "torch":
        return dualtrain_torch.attach(store, torch.optim.SGD, lr=1.0), _torch_step
    return dualtrain_jax.attach(store, optax.sgd(1.0)), _jax_step


def _run_threads(target, count: int) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def body(k: int) -> None:
        try:
            barrier.wait()
            target(k)
        except BaseException as exc:  # collected: an error in a thread must fail the test
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: more interleavings
    try:
        threads = [threading.Thread(target=body, args=(k,)) for k in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return errors


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("prefetch", [False, True])
def test_threads_lose_no_update(framework, prefetch):
    store = dualtrain.EmbeddingStore(ROWS, DIM, init="zeros")
    rows, step = _attach(framework, store)
    plans = [_batches(k) for k in range(THREADS)]
    if framework == "jax":  # compile the step once, outside the race
        step(rows, np.arange(2))
        rows.flush()
        store.table[...] = 0

    def work(k: int) -> None:
        for i, ids in enumerate(plans[k]):
            if prefetch and i + 1 < len(plans[k]):
                rows.prefetch(plans[k][i + 1])
            step(rows, ids)

    errors = _run_threads(work, THREADS)
    rows.flush()
    assert errors == []
    counts = np.bincount(np.concatenate([b for p in plans for b in p]), minlength=ROWS)
    np.testing.assert_array_equal(store.table, -np.repeat(counts[:, None], DIM, axis=1))
    assert rows.steps == THREADS * STEPS + (framework == "jax")


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_step_without_own_fetch_is_refused(framework):
    """A thread that did not fetch cannot step another thread's batch."""
    store = dualtrain.EmbeddingStore(ROWS, DIM, init="zeros")
    rows, _ = _attach(framework, store)
    emb = rows.fetch(np.arange(3))
    caught: list[BaseException] = []

    def other() -> None:
        try:
            rows.step() if framework == "torch" else rows.step(jnp.ones_like(emb))
        except BaseException as exc:
            caught.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(caught) == 1 and isinstance(caught[0], ArgumentError)
    assert "fetch" in str(caught[0]) and "thread" in str(caught[0])
    rows.release()  # the owner gives its batch up: nothing written
    rows.flush()
    assert not store.table.any()


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_fetch_without_step_then_release_frees_other_threads(framework):
    """An evaluation fetch is given back with release(); then another thread can train."""
    store = dualtrain.EmbeddingStore(ROWS, DIM, init="zeros")
    rows, step = _attach(framework, store)
    rows.fetch(np.arange(3))  # evaluation: no step
    rows.release()
    assert _run_threads(lambda k: step(rows, np.array([0, 0, 1])), 1) == []
    rows.flush()
    np.testing.assert_array_equal(store.table[:2, 0], [-2, -1])


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_dead_owner_does_not_block_the_others(framework):
    """A thread that fetched and ended without stepping: its batch is dropped, not waited on."""
    store = dualtrain.EmbeddingStore(ROWS, DIM, init="zeros")
    rows, step = _attach(framework, store)
    assert _run_threads(lambda k: rows.fetch(np.arange(3)), 1) == []
    step(rows, np.array([2]))
    rows.flush()
    assert store.table[2, 0] == -1 and not store.table[:2].any()
