"""nebulgym's ``BaseEngine``: one way to run a model (``run``, ``train``, ``eval``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from torch import nn

from dualtrain.errors import bad_argument

__all__ = ["BaseEngine"]


class BaseEngine(ABC):
    """An engine runs `model`: ``engine(x)``, ``forward`` and ``predict`` all call ``run``.

    Args:
        model: the ``nn.Module``.
    """

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise bad_argument("model", type(model).__name__, "a torch.nn.Module")
        self._model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """``run``."""
        return self.run(*args, **kwargs)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """``run``."""
        return self.run(*args, **kwargs)

    @abstractmethod
    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The model's output for these inputs."""

    @abstractmethod
    def train(self, update_torch_model: bool = True) -> Any:
        """Training mode (the model's too, when `update_torch_model`)."""

    @abstractmethod
    def eval(self, update_torch_model: bool = True) -> Any:
        """Evaluation mode (the model's too, when `update_torch_model`)."""

    @property
    def original_model(self) -> nn.Module:
        """The model given."""
        return self._model
