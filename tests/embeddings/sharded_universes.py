"""A sharded store trained by spawned workers on the engines themselves (gloo, JAX's runtime).

Workers import `universe` by name. Each case trains a fresh store sharded over the run and
returns the whole table gathered to rank 0, with what the exchange compiled (JAX) and each
rank's bytes held, for the test to hold against one process on the union of the batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import dualtrain
from tests.embeddings.ranks import attach, losses
from tests.embeddings.runs import DIM, ROWS, SEED

# Per step, each of 2 ranks' ids: sizes differ, a rank's batch may be empty, rows repeat.
STEPS = [
    [np.array([1, 7, 7, 3, 30]), np.array([0, 7, 8, 39])],
    [np.array([], np.int64), np.array([2, 2, 21, 22])],
    [np.array([9, 25, 39, 39]), np.array([], np.int64)],
    [np.array([5, 6, 35]), np.array([5, 36, 6, 0, 1])],
]
CASES = [("adam", "lazy", False), ("adam", "exact", True), ("sgd", "exact", False),
         ("adagrad", "lazy", True)]  # fmt: skip


def step(
    framework: str, rows: Any, ids: np.ndarray, weights: np.ndarray, ahead: Any = None
) -> None:
    """One step: fetch `ids`, prefetch `ahead` (the next batch, if given), backward, step."""
    e = rows.fetch(ids)
    if ahead is not None:
        rows.prefetch(ahead)
    if framework == "torch":
        import torch

        ((e * torch.from_numpy(weights)).sum() + 0.5 * (e**2).sum()).backward()
        rows.step()
    else:
        import jax

        rows.step(jax.grad(lambda e: (e * weights).sum() + 0.5 * (e**2).sum())(e))


def train(framework: str, rows: Any, batches: list[np.ndarray], rank: int, ahead: bool) -> None:
    for k, ids in enumerate(batches):
        following = batches[k + 1] if ahead and k + 1 < len(batches) else None
        step(framework, rows, ids, losses(k, rank, len(ids)), following)
    rows.settle()
    rows.flush()


def universe(mv: dualtrain.Multiverse, framework: str) -> list[dict[str, Any]]:
    out = []
    for name, mode, ahead in CASES:
        store = dualtrain.EmbeddingStore(ROWS, DIM, std=0.5, seed=SEED)
        mv.sync(store)
        allocated_at_sync = store.allocated
        rows = attach(framework, name, mode, store)
        train(framework, rows, [s[mv.rank] for s in STEPS], mv.rank, ahead)
        mine = {"rows": (store.rows.start, store.rows.stop), "weight": np.array(store.table),
                **{k: np.array(v) for k, v in store.state.items()},
                "allocated_at_sync": allocated_at_sync, "bytes": store.memory().table,
                "programs": sorted(getattr(store.shard.exchange, "programs", ()))}  # fmt: skip
        parts = sorted(mv.runtime.gather_object(mine), key=lambda p: p["rows"])
        whole = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]
                 if isinstance(parts[0][k], np.ndarray)}  # fmt: skip
        whole["ranks"] = [{k: v for k, v in p.items() if not isinstance(v, np.ndarray)}
                          for p in parts]  # fmt: skip
        out.append(whole)
    return out


def unlike(mv: dualtrain.Multiverse) -> str:
    """Each rank makes its store with its own seed: the sync must refuse it on every rank."""
    store = dualtrain.EmbeddingStore(ROWS, DIM, std=0.5, seed=mv.rank)
    try:
        mv.sync(store)
    except dualtrain.ArgumentError as err:
        return str(err)
    return "synced"
