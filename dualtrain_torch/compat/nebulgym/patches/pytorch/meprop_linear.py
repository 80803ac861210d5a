"""nebulgym's meProp layer: top-k sparsified backprop for ``nn.Linear`` (approximate).

On `dualtrain_torch.sparse_backprop`: the forward is exact; the backward keeps, per row, the
k output gradients of largest magnitude, with ``k = max(1, round(0.04 * out_features))``.
nebulgym's k was ``round(0.04 * out_features)`` and its backward returned no gradient at
all when k was 0 or not below ``in_features``: every head with up to 12 outputs, and every
widening layer, stopped training what came before it. Here k is at least 1, a layer whose k
reaches its outputs is exact, and inputs of any rank work (nebulgym's took 2-D only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dualtrain.accelerate.topk import DEFAULT_RATIO, resolve_k
from dualtrain.errors import bad_argument
from dualtrain_torch.sparse_backprop import (
    TopKLinear,
    TopKLinearFunction,
    patch_linears,
    topk_linear,
)

__all__ = ["MePropLinear", "MePropLinearFunction", "me_prop_linear", "patch_backward_pass"]


def me_prop_linear(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, k: int
) -> torch.Tensor:
    """``input @ weight.T + bias`` whose backward keeps each row's k largest gradients.

    Args:
        input: ``[..., in_features]``.
        weight: ``(out_features, in_features)``.
        bias: ``(out_features,)`` or None.
        k: output gradients kept per row, an int >= 1 (k >= out_features: exact).

    Raises:
        ArgumentError: `k` is not an int >= 1 (nebulgym's k of 0 returned no gradient).
    """
    return topk_linear(input, weight, bias, k)


class MePropLinearFunction(TopKLinearFunction):
    """nebulgym's autograd function: ``MePropLinearFunction.apply(input, weight, bias, k)``."""

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        names = ("input", "weight", "bias", "k")
        bound = dict(zip(names, args, strict=False)) | kwargs
        if set(bound) != set(names):
            raise bad_argument("arguments", sorted(bound), "input, weight, bias and k")
        weight = bound["weight"]
        k = resolve_k(weight.shape[0], k=bound["k"])
        return super().apply(bound["input"], weight, bound["bias"], k)


class MePropLinear(TopKLinear):
    """An ``nn.Linear`` with meProp's backward: k = 4% of its outputs, at least 1.

    Made like ``nn.Linear(in_features, out_features, bias=True)``, or from a layer with
    `from_linear_layer` (sharing its parameters). ``explain()`` of an accelerated model
    lists it as approximate.
    """

    _k_percentage = DEFAULT_RATIO

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.topk_k = resolve_k(self.out_features, ratio=self._k_percentage)

    @property
    def k(self) -> int:
        """Output gradients kept per row."""
        return self.topk_k

    @classmethod
    def from_linear_layer(cls, linear_layer: nn.Linear) -> MePropLinear:
        """A MePropLinear sharing `linear_layer`'s weight and bias, on its device."""
        if not isinstance(linear_layer, nn.Linear):
            raise bad_argument("linear_layer", type(linear_layer).__name__, "an nn.Linear")
        weight, bias = linear_layer.weight, linear_layer.bias
        layer = cls(
            linear_layer.in_features,
            linear_layer.out_features,
            bias=bias is not None,
            device="meta",  # no memory for parameters replaced at once
            dtype=weight.dtype,
        )
        layer.weight = weight
        layer.bias = bias
        return layer


def patch_backward_pass(model: nn.Module) -> nn.Module:
    """Gives every ``nn.Linear`` of `model` (itself included) meProp's backward, in place.

    Returns `model` (nebulgym returned a new layer for a bare ``nn.Linear``; here the layer
    itself changes, so ``layer = patch_backward_pass(layer)`` works either way). Only exact
    ``nn.Linear`` layers change: a subclass may compute something else in its forward.
    ``dualtrain_torch.sparse_backprop.unpatch_linears(model)`` undoes it.
    """
    if not isinstance(model, nn.Module):
        raise bad_argument("model", type(model).__name__, "a torch.nn.Module")
    patch_linears(model, ratio=DEFAULT_RATIO)
    return model
