"""Several ranks of a sharded store as threads of one process, joined by a real all-to-all.

`ThreadExchange` meets `dualtrain.embeddings.Exchange` with a `threading.Barrier`: each rank
posts its parts, every rank takes its own, and a second barrier keeps a fast rank's next
call from overwriting what a slow one has not taken. The laws of sharding (routing, summing,
owners stepping once) then run under Hypothesis in milliseconds; the engines' own exchanges
(gloo, JAX's runtime) are tested by the spawned runs in tests/embeddings/{torch,jax}.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import dualtrain
from tests.embeddings.runs import DIM, ROWS, SEED, coef


class Hub:
    """The shared post of `world` thread ranks."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.posted: list[Any] = [None] * world
        self.barrier = threading.Barrier(world, timeout=60)


class ThreadExchange:
    """One thread rank's all-to-all over a `Hub`."""

    def __init__(self, hub: Hub, rank: int) -> None:
        self.hub, self.rank, self.world = hub, rank, hub.world
        self.calls = 0

    def all_to_all(self, parts: list[np.ndarray], /) -> list[np.ndarray]:
        assert len(parts) == self.world
        self.calls += 1
        self.hub.posted[self.rank] = [np.array(p, copy=True) for p in parts]
        self.hub.barrier.wait()
        mine = [self.hub.posted[j][self.rank] for j in range(self.world)]
        self.hub.barrier.wait()
        return mine


def run_ranks(world: int, body: Callable[[int, ThreadExchange], Any]) -> list[Any]:
    """``body(rank, exchange)`` on `world` threads at once; their results by rank."""
    hub = Hub(world)
    with ThreadPoolExecutor(world) as pool:
        futures = [pool.submit(body, r, ThreadExchange(hub, r)) for r in range(world)]
        try:
            return [f.result(timeout=120) for f in futures]
        except BaseException:
            hub.barrier.abort()  # the others stop waiting for a rank that failed
            raise


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
