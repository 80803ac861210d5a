"""The demo's runs that both adapters train, each described once, as one frozen object.

An adapter's ``train_sweep`` takes a `Sweep` (`dualtrain.demo.sweep.SWEEP_CONTRACT`), its
``train_embeddings`` a `Factorization` (`dualtrain.demo.embeddings.EMBED_CONTRACT`): what the
contract fixes (the batching, the stores, the mini-batches) is read from it, not restated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from dualtrain.craft import Craft
from dualtrain.embeddings import EmbeddingStore

__all__ = ["Factorization", "Sweep"]


@dataclass(frozen=True, eq=False)  # arrays inside: identity, as a plain object
class Sweep:
    """A learning-rate sweep: ``len(lrs)`` copies of `craft` trained as one BatchModule."""

    craft: Craft
    x: np.ndarray  # (n, features) float32, every member's input
    y: np.ndarray  # (n,) int labels
    lrs: np.ndarray  # (members,) member i's SGD learning rate
    steps: int
    seed: int  # realizes the Craft that every member copies

    # The BatchModule's options: identical copies reading one input; vmap forced, since
    # "auto" would first time every strategy, which costs more than a sweep's 30 steps (JAX
    # compiles each candidate).
    batching: ClassVar[Mapping[str, Any]] = MappingProxyType(
        {"init": "identical", "shared_input": True, "strategy": "vmap"}
    )

    @property
    def members(self) -> int:
        """How many copies: one per learning rate."""
        return len(self.lrs)


@dataclass(frozen=True, eq=False)  # arrays inside: identity, as a plain object
class Factorization:
    """One training run of the demo's factorization model: the observations and settings.

    Both adapters read the same stores and the same mini-batches from it, so what
    `dualtrain.demo.embeddings.EMBED_CONTRACT` fixes is written once.
    """

    users: np.ndarray  # (n,) int64 user ids, each below sizes[0]
    items: np.ndarray  # (n,) int64 item ids, each below sizes[1]
    ratings: np.ndarray  # (n,) float32
    sizes: tuple[int, int]  # (num_users, num_items): the stores' rows
    dim: int  # each row's width
    lr: float  # Adam's learning rate
    batch: int  # observations per step
    steps: int
    seed: int

    def stores(self) -> tuple[EmbeddingStore, EmbeddingStore]:
        """The user and item stores: N(0, 0.1^2) rows from ``seed`` and ``seed + 1``."""
        return (
            EmbeddingStore(self.sizes[0], self.dim, std=0.1, seed=self.seed),
            EmbeddingStore(self.sizes[1], self.dim, std=0.1, seed=self.seed + 1),
        )

    def batch_rows(self, k: int) -> np.ndarray:
        """Step `k`'s observations: indices ``k * batch`` .. ``(k + 1) * batch``, mod n."""
        return np.arange(k * self.batch, (k + 1) * self.batch) % len(self.ratings)
