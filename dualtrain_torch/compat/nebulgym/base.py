"""nebulgym's backend names (``nebulgym.base``)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["NebulgymBackend"]


class NebulgymBackend(StrEnum):
    """The backends of nebulgym; each names a rung of dualtrain's ladder (`dualtrain.accelerate`).

    Anywhere ``backends=`` is taken, a member and its string are the same. PYTORCH is eager
    torch, the reference every other rung is verified against. ONNXRUNTIME is ONNX
    Runtime. TORCHSCRIPT and RAMMER are accepted and never serve (TorchScript's trace froze
    train/eval mode and data-dependent branches; Rammer needs nnfusion, a CUDA compiler no
    longer maintained): ``explain()`` lists them as pending, then unavailable once the
    ladder reaches them, and eager torch runs, as nebulgym fell back when a backend failed.
    dualtrain's own rungs (``"TORCH_COMPILE"``, ``"CHANNELS_LAST"``, ``"CUDA_GRAPHS"``,
    ``"COMPILED_STEP"``) are taken as strings.
    """

    PYTORCH = "PYTORCH"
    TORCHSCRIPT = "TORCHSCRIPT"
    ONNXRUNTIME = "ONNXRUNTIME"
    RAMMER = "RAMMER"
