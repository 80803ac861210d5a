"""torchmb's ``AbstractBatchAdapter`` (``torchmb.adapters``): a batch module to subclass.

A batch module with no base class of its own: subclass it, write ``forward`` on merged
``(b g)`` tensors, and hold each member's tensors as ``[batch, ...]``.
"""

from __future__ import annotations

from typing import Any

from dualtrain_torch.compat.torchmb.base import AbstractBatchModule

__all__ = ["AbstractBatchAdapter"]


class AbstractBatchAdapter(AbstractBatchModule):
    """An `AbstractBatchModule` whose ``forward`` its subclass writes.

    Args:
        batch: the member count, a positive int.
    """

    def forward(self, *x: Any) -> Any:
        """Raises: a subclass must write its own ``forward``."""
        raise NotImplementedError(
            f"{type(self).__name__} must define forward: AbstractBatchAdapter is a base "
            "class (merged (b g) tensors in, merged tensors out)"
        )
