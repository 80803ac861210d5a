"""A sharded set written under one framework loads under the other at another world size
(ranks as threads: tests.embeddings.thread_ranks): the tables, Adam's moments, exact mode's
counters and the step, as written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualtrain import EmbeddingStore, TimeMachine
from tests.checkpoint.torch.test_embedding_sets import SLOTS, fill, truth
from tests.embeddings.thread_ranks import run_ranks, unwrap

torch = pytest.importorskip("torch")
optax = pytest.importorskip("optax")
import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402

ROWS = 9


def rows_of(fw: str, rank: int, world: int, exchange, seed: int):
    store = EmbeddingStore(ROWS, 2, seed=seed)
    store.make_shard(rank, world, exchange)
    if fw == "torch":
        return dualtrain_torch.attach(store, torch.optim.Adam, mode="exact", lr=0.1)
    return dualtrain_jax.attach(store, optax.adam(0.1), mode="exact")


@pytest.mark.parametrize(("writer", "reader"), [("torch", "jax"), ("jax", "torch")])
def test_a_set_moves_between_frameworks_and_world_sizes(tmp_path: Path, writer, reader):
    whole = truth(ROWS, 12)

    def write(rank, ex):
        rows = rows_of(writer, rank, 2, ex, 1)
        fill(rows, whole)
        return TimeMachine(save_path=tmp_path).drop_embeddings(rows, "emb")

    def read(rank, ex):
        rows = rows_of(reader, rank, 3, ex, 2)
        manifest = TimeMachine(save_path=tmp_path).to_embeddings(rows, "emb")
        store = rows.store
        a, b = store.rows.start, store.rows.stop
        np.testing.assert_array_equal(store.table, whole["weight"][a:b])
        for slot in SLOTS:
            np.testing.assert_array_equal(store.state[slot], whole[slot][a:b])
        np.testing.assert_array_equal(store.counters, whole["counters"][a:b])
        assert rows.steps == whole["step"] and manifest["backend"] == writer
        return b - a

    unwrap(run_ranks(2, write))
    assert sum(unwrap(run_ranks(3, read))) == ROWS
