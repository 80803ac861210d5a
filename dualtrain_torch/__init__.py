"""dualtrain's PyTorch adapter: imports torch and dualtrain, never JAX."""

from __future__ import annotations

from dualtrain_torch.backend import TorchBackend

__all__ = ["TorchBackend"]
