"""One run of the demo's factorization model: what both adapters' ``train_embeddings`` read.

`dualtrain.demo.embeddings.EMBED_CONTRACT` says what they compute from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dualtrain.embeddings import EmbeddingStore

__all__ = ["Factorization"]


@dataclass(frozen=True)
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
