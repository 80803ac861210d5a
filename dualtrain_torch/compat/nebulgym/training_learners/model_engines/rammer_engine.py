"""nebulgym's ``RammerEngine``: Rammer (nnfusion), reported unavailable; eager runs.

nebulgym compiled the model with nnfusion's PTRunner (CUDA only) and failed when nnfusion
was missing. dualtrain accepts the RAMMER rung for nebulgym's scripts and reports it
unavailable in ``explain()``; the engine then runs eager PyTorch.
"""

from __future__ import annotations

from dualtrain_torch.compat.nebulgym.training_learners.model_engines.torch_engine import (
    RungEngine,
)

__all__ = ["RammerEngine"]


class RammerEngine(RungEngine):
    """Rammer: never available here; eager PyTorch runs (see explain())."""

    rung = "RAMMER"
