"""Reshape and Flatten: layers that only rearrange values."""

from __future__ import annotations

import dataclasses
from typing import Any

from dualtrain.craft.checks import check_reshape
from dualtrain.craft.specs.base import Layer, is_int, items
from dualtrain.errors import ShapeError, bad_argument
from dualtrain.validate import check_int

__all__ = ["Flatten", "Reshape"]


@dataclasses.dataclass(frozen=True, eq=False)
class Reshape(Layer):
    """Reshapes to `shape`, given here or at call time: ``self.flat(x, (-1, 256))``."""

    shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.shape is not None:
            shape = items(self.shape)
            ok = bool(shape) and all(is_int(n) and (n >= 0 or n == -1) for n in shape)
            if not ok or sum(n == -1 for n in shape) > 1:
                raise bad_argument(
                    "shape", self.shape, "None or a tuple of ints >= 0 with at most one -1"
                )
            object.__setattr__(self, "shape", tuple(int(n) for n in shape))

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes any input whose values fill the target shape (given here or at call time)."""
        check_reshape(rest[0] if rest else kwargs.get("shape", self.shape), tuple(x.shape))


@dataclasses.dataclass(frozen=True, eq=False)
class Flatten(Layer):
    """Flattens axes `start` onwards: ``(N, C, H, W) -> (N, C·H·W)`` with start=1."""

    start: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", check_int("start", self.start))

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes an input that has axis `start`."""
        shape = tuple(x.shape)
        rank = max(len(shape), 1)  # a 0-d input flattens like a 1-d one, as in torch
        if not -rank <= self.start < rank:
            raise ShapeError(
                f"Flatten(start={self.start}) needs an axis in [{-rank}, {rank - 1}] of the "
                f"input; got shape {shape}"
            )
