"""Top-k sparsified backprop for dense (Linear) layers: meProp, opt-in and approximate.

meProp (Sun et al., ICML 2017) keeps the forward pass exact and sparsifies only the gradient
that flows back through a dense layer ``y = x @ W.T + b`` with ``x`` of shape ``[..., in]``,
``W`` of shape ``(out, in)`` and ``y`` of shape ``[..., out]``. Given the upstream gradient
``g = dL/dy`` (shape ``[..., out]``), each row of ``g`` (one sample, or one token of a
``[B, T, C]`` input: every position along the leading axes) keeps its ``k`` entries of largest
``|g|`` and zeroes the rest, giving ``g~``. Then::

    grad_input  = g~ @ W                                   # [..., in]
    grad_weight = g~.reshape(-1, out).T @ x.reshape(-1, in)  # (out, in)
    grad_bias   = g.reshape(-1, out).sum(0)                  # DENSE, as in the paper

The bias gradient uses the full ``g``: it costs nothing and the paper keeps it dense. When
``k >= out`` nothing is dropped and the adapters run the framework's own dense layer, so the
gradients are exactly the dense ones (bit for bit).

``k`` is never 0. nebulgym computed ``k = round(0.04 * out)``, which is 0 for every head with
up to 12 outputs, and then returned no gradient at all upstream of that head; here
`resolve_k` floors the result at 1.

This module is the framework-free part: choosing k (`resolve_k`), describing what was
approximated (`Approximation`), and the hand-written NumPy reference (`topk_reference`) that
the torch (``dualtrain_torch.sparse_backprop``) and JAX (``dualtrain_jax.sparse_backprop``)
implementations are tested against.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["DEFAULT_RATIO", "Approximation", "resolve_k", "topk_reference"]

DEFAULT_RATIO = 0.04
"""meProp's ratio, as nebulgym used it: keep 4% of each row's output gradients."""


def _check_count(name: str, value: Any, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lowest:
        raise bad_argument(name, value, f"an int >= {lowest}")
    return int(value)


def resolve_k(features: int, k: int | None = None, ratio: float | None = None) -> int:
    """How many output gradients per row a layer with `features` outputs keeps.

    Args:
        features: the layer's output features (``out_features``), an int >= 0.
        k: an explicit count, an int >= 1; it may exceed `features` (the layer is then
            dense and exact). Exclusive with `ratio`.
        ratio: the fraction of `features` to keep, in (0, 1]; default 0.04 (meProp's).
            The count is ``max(1, round(ratio * features))`` (Python's round, half to even).

    Returns:
        k >= 1, never 0. A result >= `features` means "dense": callers run the exact layer.

    Raises:
        ArgumentError: `features`, `k` or `ratio` out of range, or both `k` and `ratio`.
    """
    features = _check_count("features", features, 0)
    if k is not None:
        if ratio is not None:
            raise bad_argument("ratio", ratio, "None when k is given (pass k or ratio, not both)")
        return _check_count("k", k, 1)
    value: Any = DEFAULT_RATIO if ratio is None else ratio  # Any: callers pass anything
    number = float(value) if isinstance(value, numbers.Real) else math.nan
    if isinstance(value, bool) or not (math.isfinite(number) and 0 < number <= 1):
        raise bad_argument("ratio", ratio, "a number in (0, 1]")
    return max(1, round(number * features))


@dataclasses.dataclass(frozen=True)
class Approximation:
    """What top-k backprop does to one dense layer.

    Attributes:
        layer: the layer's name (``named_modules`` name under torch, the neutral name of its
            parameters under JAX: ``"fc"`` for ``"fc.weight"``); ``""`` is a root module.
        features: the layer's output features.
        k: output gradients kept per row.
    """

    layer: str
    features: int
    k: int

    @property
    def dense(self) -> bool:
        """True when nothing is dropped (``k >= features``): the gradients are exact."""
        return self.k >= self.features

    def describe(self) -> str:
        """One line for ``explain()``, e.g. ``fc1: top-12 of 300 output gradients ...``."""
        name = self.layer or "(root)"
        if self.dense:
            return f"{name}: dense (k={self.k} >= {self.features} features, exact)"
        return (
            f"{name}: top-{self.k} of {self.features} output gradients per sample "
            "(meProp, approximate)"
        )


def topk_reference(grad_out: np.ndarray, k: int) -> np.ndarray:
    """The hand-written reference: each row of `grad_out` keeps its k largest ``|g|``.

    Rows run over every axis but the last (``[B, T, C]`` has ``B * T`` rows). Ties in
    ``|g|`` keep the lower index (a stable sort of ``-|g|``), the rule of JAX's
    ``lax.top_k``; torch's ``topk`` documents no tie rule, so tests draw distinct
    magnitudes. NaN sorts last here (never kept); the adapters make no promise about NaN.

    Args:
        grad_out: the upstream gradient, shape ``[..., features]`` (at least 1-D).
        k: an int >= 1; ``k >= features`` returns a copy of `grad_out` unchanged.

    Returns:
        A new array of `grad_out`'s shape and dtype, zero outside each row's top k.

    Raises:
        ArgumentError: `k` below 1, or `grad_out` 0-D.
    """
    k = _check_count("k", k, 1)
    g = np.asarray(grad_out)
    if g.ndim == 0:
        raise bad_argument("grad_out", g, "an array of at least one axis ([..., features])")
    features = g.shape[-1]
    if k >= features:
        return g.copy()
    flat = g.reshape(-1, features)
    order = np.argsort(-np.abs(flat), axis=-1, kind="stable")[:, :k]
    out = np.zeros_like(flat)
    np.put_along_axis(out, order, np.take_along_axis(flat, order, axis=-1), axis=-1)
    return out.reshape(g.shape)
