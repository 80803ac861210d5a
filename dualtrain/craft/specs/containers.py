"""Sequential (layers in order) and Native (a framework's own function inside a Craft)."""

from __future__ import annotations

import dataclasses
from typing import Any

from dualtrain.craft import binding
from dualtrain.craft.specs.base import Layer
from dualtrain.errors import bad_argument

__all__ = ["Native", "Sequential"]


class Sequential(Layer):
    """Layers (or Crafts) applied in order; their parameters are named ``seq.0.weight``."""

    layers: tuple[Any, ...]

    def __init__(self, *layers: Any) -> None:
        if not layers:
            raise bad_argument("layers", layers, "at least one layer")
        object.__setattr__(self, "layers", tuple(layers))

    def __call__(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x


@dataclasses.dataclass(frozen=True, eq=False)
class Native(Layer):
    """A framework-native function held by a Craft: ``dock.Native(fn, backend="jax")``.

    It runs only when the Craft is realized under `backend`; the other backend refuses the
    Craft, naming this layer. (A torch ``nn.Module`` assigned to a Craft is recognized as
    native without this wrapper.)
    """

    fn: Any
    backend: str

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise bad_argument("fn", self.fn, "a callable")
        if self.backend not in ("torch", "jax"):
            raise bad_argument("backend", self.backend, "'torch' or 'jax'")

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return binding.current("Native").native(self, *inputs, **kwargs)
