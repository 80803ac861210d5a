"""nebulgym's ``TorchEngine`` and ``TorchScriptEngine``, as rungs of dualtrain's ladder.

Each engine runs the model through dualtrain's ladder restricted to its backend's rung and
eager PyTorch (`dualtrain_torch.compilation.module.AcceleratedForward`), without changing
the model: the rung serves only once verified against eager on the real batch, and
``engine.explain()`` says what ran. TorchEngine is eager torch (``model.forward``, as
nebulgym's). TorchScriptEngine's rung is never tried (a trace froze train/eval mode and
data-dependent branches): it runs eager torch, and ``explain()`` says so.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import Explanation
from dualtrain.errors import bad_argument
from dualtrain_torch.compat.nebulgym.training_learners.model_engines.base import BaseEngine
from dualtrain_torch.compilation.module import AcceleratedForward

__all__ = ["RungEngine", "TorchEngine", "TorchScriptEngine"]


class RungEngine(BaseEngine):
    """An engine running its model on one rung of dualtrain's ladder, eager behind it.

    Args:
        model: the ``nn.Module`` (left as it is).

    Attributes:
        rung: the rung's name (`dualtrain.accelerate.RUNGS`).
    """

    rung = "PYTORCH"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._forward = AcceleratedForward(model, (self.rung,), False, LadderOptions())

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward on the rung (eager until the rung is verified)."""
        return self._forward(*args, **kwargs)

    def train(self, update_torch_model: bool = True) -> RungEngine:
        """Sets the model's training mode when `update_torch_model`; the rung follows it."""
        _check_update(update_torch_model)
        if update_torch_model:
            self._model.train()
        return self

    def eval(self, update_torch_model: bool = True) -> RungEngine:
        """Sets the model's evaluation mode when `update_torch_model`; the rung follows it."""
        _check_update(update_torch_model)
        if update_torch_model:
            self._model.eval()
        return self

    def explain(self) -> Explanation:
        """What ran for each mode and input signature, and why (dualtrain's report)."""
        return self._forward.explain()


def _check_update(value: Any) -> None:
    if not isinstance(value, bool):
        raise bad_argument("update_torch_model", value, "True or False")


class TorchEngine(RungEngine):
    """Eager PyTorch: the model's own forward."""

    rung = "PYTORCH"


class TorchScriptEngine(RungEngine):
    """nebulgym's TorchScript trace: never tried here; eager PyTorch runs (see explain())."""

    rung = "TORCHSCRIPT"
