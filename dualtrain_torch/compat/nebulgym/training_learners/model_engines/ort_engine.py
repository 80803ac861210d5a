"""nebulgym's ``ORTEngine``: ONNX Runtime, as dualtrain's ONNXRUNTIME rung.

nebulgym wrapped the model in torch-ort's ORTModule (an NVIDIA GPU, and its output hidden).
dualtrain's rung runs evaluation in ONNX Runtime inference sessions (the ``onnx`` extra) and
training in ORTModule where onnxruntime-training is installed; each is used only once
verified against eager PyTorch, and eager runs otherwise (``explain()`` says why).
"""

from __future__ import annotations

from dualtrain_torch.compat.nebulgym.training_learners.model_engines.torch_engine import (
    RungEngine,
)

__all__ = ["ORTEngine"]


class ORTEngine(RungEngine):
    """ONNX Runtime, verified against eager PyTorch."""

    rung = "ONNXRUNTIME"
