"""The demo's embedding part: a factorization model trained from two EmbeddingStores.

Ratings come from hidden low-rank user and item factors. Under torch
(``torch.optim.Adam``) and under JAX (``optax.adam``) two host-memory tables of user and
item rows are trained on the same mini-batches from the same initial rows, so the two loss
curves agree to float32 rounding.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console

from dualtrain.demo.runs import Factorization
from dualtrain.demo.seams import demo_part
from dualtrain.demo.table import loss_table

__all__ = ["EMBED_CONTRACT", "make_ratings", "run_embeddings"]

EMBED_CONTRACT = """
``train_embeddings(run: Factorization) -> losses`` in each adapter's ``demo`` module: the
two stores of ``run.stores()`` (``run.sizes = (num_users, num_items)``, ``run.dim`` wide,
N(0, 0.1^2) rows from ``run.seed`` and ``run.seed + 1``) attached to Adam(run.lr) in lazy
mode; step k trains on the observations ``run.batch_rows(k)`` (rows ``k * batch`` ..
``(k + 1) * batch``, mod n) with the loss ``mean((<user row, item row> - rating)^2)``, and
records it, for ``run.steps`` steps.
"""


def make_ratings(
    seed: int, users: int = 5_000, items: int = 2_000, n: int = 40_000, rank: int = 4
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`n` (user, item, rating) triples from hidden rank-`rank` factors, plus noise."""
    rng = np.random.default_rng(seed)
    u, v = rng.standard_normal((users, rank)), rng.standard_normal((items, rank))
    who = rng.zipf(1.5, n) % users  # popular users and items repeat within a batch
    what = rng.zipf(1.5, n) % items
    rating = (u[who] * v[what]).sum(1) / np.sqrt(rank) + 0.1 * rng.standard_normal(n)
    return who.astype(np.int64), what.astype(np.int64), rating.astype(np.float32)


def run_embeddings(
    console: Console, seed: int = 0, steps: int = 150, names: tuple[str, ...] = ("torch", "jax")
) -> dict:
    """Trains the factorization model under each framework of `names`; prints the curves."""
    users, items, ratings = make_ratings(seed)
    sizes, dim = (5_000, 2_000), 8
    factorization = Factorization(
        users, items, ratings, sizes=sizes, dim=dim, lr=0.05, batch=512, steps=steps, seed=seed
    )
    losses = {name: demo_part(name).train_embeddings(factorization) for name in names}
    title = (
        f"user x item factorization from two EmbeddingStores ({sizes[0]:,} + {sizes[1]:,} "
        f"rows x {dim}, Adam, {steps} batches of 512)"
    )
    console.print(loss_table(title, "batch", losses, rows=5))
    return {f"embed_{name}_losses": losses[name] for name in names}
