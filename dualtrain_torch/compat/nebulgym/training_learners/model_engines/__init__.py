"""nebulgym's engines and ``ENGINE_MAP`` (backend -> engine class), on dualtrain's ladder.

``ENGINE_MAP[NebulgymBackend.X](model)`` gives an engine running `model` on that rung,
verified against eager PyTorch; `TrainingLearner` does not read this map (dualtrain's ladder
chooses among the ``backends`` given).
"""

from __future__ import annotations

from dualtrain_torch.compat.nebulgym.base import NebulgymBackend
from dualtrain_torch.compat.nebulgym.training_learners.model_engines.base import BaseEngine
from dualtrain_torch.compat.nebulgym.training_learners.model_engines.ort_engine import (
    ORTEngine,
)
from dualtrain_torch.compat.nebulgym.training_learners.model_engines.rammer_engine import (
    RammerEngine,
)
from dualtrain_torch.compat.nebulgym.training_learners.model_engines.torch_engine import (
    RungEngine,
    TorchEngine,
    TorchScriptEngine,
)

__all__ = [
    "ENGINE_MAP",
    "BaseEngine",
    "ORTEngine",
    "RammerEngine",
    "TorchEngine",
    "TorchScriptEngine",
]

ENGINE_MAP: dict[NebulgymBackend, type[RungEngine]] = {
    NebulgymBackend.PYTORCH: TorchEngine,
    NebulgymBackend.TORCHSCRIPT: TorchScriptEngine,
    NebulgymBackend.ONNXRUNTIME: ORTEngine,
    NebulgymBackend.RAMMER: RammerEngine,
}
