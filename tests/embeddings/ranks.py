"""The sharded store's laws over thread ranks (`tests.embeddings.thread_ranks`).

Several ranks as threads of one process, joined by a real all-to-all: the laws of sharding
(routing, summing, owners stepping once) run under Hypothesis in milliseconds; the engines'
own exchanges (gloo, JAX's runtime) are tested by the spawned runs in
tests/embeddings/{torch,jax}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import dualtrain
from tests.embeddings import thread_ranks
from tests.embeddings.runs import DIM, ROWS, SEED, coef
from tests.embeddings.thread_ranks import ThreadExchange, unwrap


def run_ranks(
    world: int, body: Callable[[int, ThreadExchange], Any], ahead: bool = False
) -> list[Any]:
    """``body(rank, exchange)`` on `world` thread ranks; their results by rank (or the
    first rank's own error, raised). `ahead`: exchanges with a second channel."""
    return unwrap(thread_ranks.run_ranks(world, body, ahead=ahead))


def shard(rank: int, exchange: ThreadExchange, pinned: bool = False) -> dualtrain.EmbeddingStore:
    """The laws' table (tests.embeddings.runs.store), made rank `rank`'s shard."""
    store = dualtrain.EmbeddingStore(ROWS, DIM, std=0.5, seed=SEED, pinned=pinned)
    store.make_shard(rank, exchange.world, exchange)
    return store


# The optimizers the laws run, as torch's and optax's spellings of the same arithmetic (optax
# adds eps inside Adagrad's root and starts its sum at 0.1 unless told).
OPTIMIZERS = ("adagrad", "adam", "sgd")


def attach(framework: str, name: str, mode: str, store: dualtrain.EmbeddingStore) -> Any:
    """`store` attached to optimizer `name` of `OPTIMIZERS` under `framework`."""
    if framework == "torch":
        import torch

        from dualtrain_torch import attach as torch_attach

        cls, kw = {
            "adam": (torch.optim.Adam, {"lr": 0.05}),
            "sgd": (torch.optim.SGD, {"lr": 0.1}),
            "adagrad": (
                torch.optim.Adagrad,
                {"lr": 0.1, "eps": 0.0, "initial_accumulator_value": 0.1},
            ),
        }[name]
        return torch_attach(store, cls, mode=mode, **kw)
    import optax

    from dualtrain_jax import attach as jax_attach

    tx = {
        "adam": optax.adam(0.05),
        "sgd": optax.sgd(0.1),
        "adagrad": optax.adagrad(0.1, initial_accumulator_value=0.1, eps=0.0),
    }[name]
    return jax_attach(store, tx, mode=mode)


def losses(step: int, rank: int, n: int) -> np.ndarray:
    """Rank `rank`'s loss weights at `step` (n rows): loss = sum(e * c) + 0.5 * sum(e**2)."""
    return coef(1000 * rank + step, n)


def union(steps: list[list[np.ndarray]], world: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One process's batches and weights: every rank's ids and weights, joined in rank order."""
    ids = [np.concatenate([steps[k][r] for r in range(world)]) for k in range(len(steps))]
    weights = [
        np.concatenate([losses(k, r, len(steps[k][r])) for r in range(world)])
        for k in range(len(steps))
    ]
    return ids, weights


def gathered(stores: list[dualtrain.EmbeddingStore]) -> dict[str, np.ndarray]:
    """The whole table and state tables from every rank's shard, in id order."""
    out = {"weight": np.concatenate([s.table for s in stores])}
    for slot in stores[0].state:
        out[slot] = np.concatenate([s.state[slot] for s in stores])
    return out


def shard_against_one(
    framework: str, attach_to: Callable[[dualtrain.EmbeddingStore], Any]
) -> tuple[dict[str, np.ndarray], dualtrain.EmbeddingStore]:
    """The fixed batches of `sharded_universes.STEPS` on 2 thread ranks and on one process.

    `attach_to(store)` attaches a store under `framework`. Returns the ranks' gathered
    tables and the single process's store (its union batch, summed loss).
    """
    from tests.embeddings.runs import store
    from tests.embeddings.sharded_universes import STEPS, step

    def body(rank: int, exchange: ThreadExchange) -> dualtrain.EmbeddingStore:
        rows = attach_to(shard(rank, exchange))
        for k, per_rank in enumerate(STEPS):
            step(framework, rows, per_rank[rank], losses(k, rank, len(per_rank[rank])))
        rows.settle()
        rows.flush()
        return rows.store

    got = gathered(run_ranks(2, body))
    single = store()
    rows = attach_to(single)
    for ids, weights in zip(*union(STEPS, 2), strict=True):
        step(framework, rows, ids, weights)
    rows.settle()
    rows.flush()
    return got, single
