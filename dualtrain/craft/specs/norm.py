"""Normalization: BatchNorm over the channel axis, LayerNorm over trailing axes."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dualtrain.craft.checks import check_channels
from dualtrain.craft.params import ParamSpec
from dualtrain.craft.specs.base import Layer, check_eps, flags, is_int, items, positive
from dualtrain.errors import ShapeError, bad_argument
from dualtrain.validate import check_finite

__all__ = ["BatchNorm", "LayerNorm"]


@dataclasses.dataclass(frozen=True, eq=False)
class BatchNorm(Layer):
    """Batch normalization over axis 1 of ``(N, C, ...)``; torch's momentum convention.

    Training normalizes with the batch's biased variance and updates the running statistics
    (``running = (1 - momentum)·running + momentum·batch``, unbiased variance); evaluation
    uses the running statistics.
    """

    input_dtypes = "params"  # see dualtrain.craft.checks.check_dtype

    num_features: int
    eps: float = 1e-5
    momentum: float = 0.1
    affine: bool = True

    def __post_init__(self) -> None:
        positive(self, "num_features")
        check_eps(self)
        # torch's momentum=None (a cumulative average) is not offered: name it clearly.
        momentum = check_finite("momentum", self.momentum, 0.0, 1.0, expected="a float in [0, 1]")
        object.__setattr__(self, "momentum", momentum)
        flags(self, "affine")

    def params(self) -> dict[str, ParamSpec]:
        c = (self.num_features,)
        out = {}
        if self.affine:
            out = {"weight": ParamSpec(c, "ones"), "bias": ParamSpec(c, "zeros")}
        out["running_mean"] = ParamSpec(c, "zeros", trainable=False)
        out["running_var"] = ParamSpec(c, "ones", trainable=False)
        return out

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes ``(N, num_features, ...)``; in training, more than one value per channel."""
        shape = tuple(x.shape)
        check_channels(type(self).__name__, shape, self.num_features)
        # 0 values too (an empty batch): torch would write NaN into the running statistics
        if train and math.prod(shape) // shape[1] <= 1:
            raise ShapeError(
                "BatchNorm in training needs more than 1 value per channel (the batch "
                f"variance of fewer than two values is undefined); got shape {shape}"
            )


@dataclasses.dataclass(frozen=True, eq=False)
class LayerNorm(Layer):
    """Normalizes over the trailing axes given by `shape`."""

    input_dtypes = "params"  # see dualtrain.craft.checks.check_dtype

    shape: Any
    eps: float = 1e-5
    affine: bool = True

    def __post_init__(self) -> None:
        shape = (self.shape,) if is_int(self.shape) else items(self.shape)
        if not shape or not all(is_int(n) and n > 0 for n in shape):
            raise bad_argument("shape", self.shape, "a positive int or a tuple of them")
        object.__setattr__(self, "shape", tuple(int(n) for n in shape))
        check_eps(self)
        flags(self, "affine")

    def params(self) -> dict[str, ParamSpec]:
        if not self.affine:
            return {}
        shape = self.shape
        return {"weight": ParamSpec(shape, "ones"), "bias": ParamSpec(shape, "zeros")}

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes ``(..., *shape)``."""
        shape = tuple(x.shape)
        if shape[-len(self.shape) :] != self.shape:
            raise ShapeError(f"LayerNorm over {self.shape} takes (..., *{self.shape}); got {shape}")
