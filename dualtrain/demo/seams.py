"""What the demo asks of an adapter's ``demo`` module: its training loops, the same maths.

`demo_part(name)` returns the adapter's module typed as `DemoPart`, and
``tests/test_seams.py`` checks both adapters against these signatures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from dualtrain import backends

if TYPE_CHECKING:
    import numpy as np

    from dualtrain.craft.craft import Craft
    from dualtrain.demo.runs import Factorization, Sweep

__all__ = ["DemoPart", "demo_part"]


class DemoPart(Protocol):
    """``dualtrain_<name>.demo``, used by `dualtrain.demo` (`dualtrain.demo.TRAIN_CONTRACT`)."""

    def train(
        self, craft: Craft, x: np.ndarray, y: np.ndarray, *, lr: float, steps: int, seed: int
    ) -> tuple[list[float], Any]:
        """Full-batch SGD on (x, y): the losses before each step and the trained module."""
        ...

    def train_sweep(self, sweep: Sweep) -> list[list[float]]:
        """A learning-rate sweep trained as one BatchModule: each step's member losses."""
        ...

    def fit(
        self, craft: Craft, train: Any, *, epochs: int, lr: float, seed: int, dash: Any,
        test: Any = None, device: Any = None,
    ) -> tuple[Any, list[float], str]:  # fmt: skip
        """`epochs` epochs of Adam on `train` (NCHW float images, int labels), accelerated.

        The model is realized on `device` (a `dualtrain.Engine` too), where the Tanks
        deliver. Each step's loss is gauged on `dash` (a `dualtrain.DashBoard`) as a device
        scalar;
        after each epoch the accuracy on every row of `test`. Returns the trained module,
        each epoch's test accuracy, and the compile ladder's verdict (one line).
        """
        ...

    def evaluate(self, module: Any, tank: Any) -> tuple[np.ndarray, np.ndarray]:
        """Logits ``(n, classes)`` and labels ``(n,)`` of every row of one epoch of `tank`.

        Rows a pad-and-mask Tank marks False are left out, so each pack row counts once.
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

    def train_embeddings(self, run: Factorization) -> list[float]:
        """A user x item factorization trained from two EmbeddingStores: its losses."""
        ...


def demo_part(name: str) -> DemoPart:
    """Backend `name`'s ``demo`` module (loads its framework)."""
    return backends.load_part(name, "demo")
