"""dualtrain's PyTorch adapter: imports torch and dualtrain, never JAX."""

from __future__ import annotations

from dualtrain_torch.backend import TorchBackend
from dualtrain_torch.embeddings import TorchRows, attach

__all__ = ["TorchBackend", "TorchRows", "attach"]
