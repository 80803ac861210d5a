"""What the demo asks of an adapter's ``demo`` module: three training loops, same maths.

`dualtrain.backends.load_part` returns the adapter's module typed as `DemoPart`, and
``tests/core/test_seams.py`` checks both adapters against these signatures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from dualtrain.craft.craft import Craft

__all__ = ["DemoPart"]


class DemoPart(Protocol):
    """``dualtrain_<name>.demo``, used by `dualtrain.demo` (`dualtrain.demo.TRAIN_CONTRACT`)."""

    def train(
        self, craft: Craft, x: np.ndarray, y: np.ndarray, *, lr: float, steps: int, seed: int
    ) -> tuple[list[float], Any]:
        """Full-batch SGD on (x, y): the losses before each step and the trained module."""
        ...

    def train_sweep(
        self, craft: Craft, x: np.ndarray, y: np.ndarray, *, lrs: np.ndarray, steps: int, seed: int
    ) -> list[list[float]]:
        """A learning-rate sweep trained as one BatchModule: each step's member losses."""
        ...

    def train_from_tank(
        self, craft: Craft, tank: Any, *, lr: float, steps: int, seed: int
    ) -> tuple[list[float], str]:
        """`steps` SGD steps on `tank`'s batches: each loss, and the compile ladder's verdict.

        The training goes through the adapter's compile ladder (`accelerate`).
        """
        ...

    def train_parallel(
        self, mv: Any, craft: Craft, tank: Any, *, lr: float, steps: int, seed: int
    ) -> list[float]:
        """`steps` data-parallel SGD steps of `craft` on `tank` under Multiverse `mv`.

        Realized with `seed` on every worker, synced (`mv.sync`, which shards the Tank),
        trained by `mv.learner`: each step's loss, the mean over every worker's rows.
        """
        ...

    def train_embeddings(
        self,
        users: np.ndarray,
        items: np.ndarray,
        ratings: np.ndarray,
        *,
        sizes: tuple[int, int],
        dim: int,
        lr: float,
        batch: int,
        steps: int,
        seed: int,
    ) -> list[float]:
        """A user x item factorization trained from two EmbeddingStores: its losses."""
        ...
