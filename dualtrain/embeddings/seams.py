"""What the embeddings core asks of an adapter's ``embeddings`` module: ``attach``, pinned memory.

`embeddings_part(name)` returns the adapter's module typed as `EmbeddingsPart`
(`torch_embeddings_part()`: `TorchEmbeddingsPart`), and ``tests/test_seams.py`` checks
both adapters against these signatures. Parameters before a ``/`` are passed by position and
named as each framework likes (a ``torch.optim`` class, an optax ``transformation``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from dualtrain import backends

if TYPE_CHECKING:
    import numpy as np

    from dualtrain.embeddings.attachment import Attachment
    from dualtrain.embeddings.store import EmbeddingStore

__all__ = ["EmbeddingsPart", "TorchEmbeddingsPart", "embeddings_part", "torch_embeddings_part"]


class EmbeddingsPart(Protocol):
    """``dualtrain_<name>.embeddings``: trains an `EmbeddingStore` row-wise."""

    def attach(
        self, store: EmbeddingStore, optimizer: Any, /, mode: str = "lazy", device: Any = None
    ) -> Attachment:
        """Trains `store` with `optimizer`, one batch of rows at a time."""
        ...


class TorchEmbeddingsPart(EmbeddingsPart, Protocol):
    """``dualtrain_torch.embeddings``: hyperparameters as keywords, and pinned host memory.

    With ``**hyper``, `store` and `optimizer` must be named so (or ``hyper`` could hold them).
    """

    def attach(
        self,
        store: EmbeddingStore,
        optimizer: Any,
        mode: str = "lazy",
        device: Any = None,
        **hyper: Any,
    ) -> Attachment:
        """Trains `store` with ``optimizer(params, **hyper)``, one batch of rows at a time."""
        ...

    def pinned_empty(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """An uninitialized host array in page-locked memory (used by `EmbeddingStore`)."""
        ...


def embeddings_part(name: str) -> EmbeddingsPart:
    """Backend `name`'s ``embeddings`` module (loads its framework)."""
    return backends.load_part(name, "embeddings")


def torch_embeddings_part() -> TorchEmbeddingsPart:
    """The torch adapter's ``embeddings`` module, pinned memory included (loads torch)."""
    return backends.load_part("torch", "embeddings")
