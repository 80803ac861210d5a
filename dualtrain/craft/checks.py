"""Input checks for dock layers, shared by every backend so errors read the same.

Each binding calls `check(layer, x)` before running a layer. Under JAX tracing the shapes are
static, so the check runs once, at trace time.
"""

from __future__ import annotations

from typing import Any

from dualtrain.craft import dock
from dualtrain.errors import DtypeError, ShapeError

__all__ = ["check"]


def check(layer: Any, x: Any) -> None:
    """Raises ShapeError/DtypeError naming the layer, what it takes and what it got."""
    kind = type(layer)
    shape = tuple(x.shape)
    if kind is dock.Dense:
        if not shape or shape[-1] != layer.in_features:
            raise ShapeError(f"Dense takes (..., {layer.in_features}); got shape {shape}")
    elif kind in (dock.Conv, dock.MaxPool, dock.AvgPool):
        _rank(layer, shape, 2 + layer.ndim, f"(N, C, {layer.ndim} spatial axes)")
        if kind is dock.Conv:
            _channels(layer, shape, layer.in_channels)
    elif kind is dock.ConvTranspose:
        _rank(layer, shape, 4, "(N, C, H, W)")
        _channels(layer, shape, layer.in_channels)
    elif kind is dock.BatchNorm:
        _channels(layer, shape, layer.num_features)
    elif kind is dock.LayerNorm:
        k = len(layer.shape)
        if shape[-k:] != layer.shape:
            raise ShapeError(
                f"LayerNorm over {layer.shape} takes (..., *{layer.shape}); got {shape}"
            )
    elif kind in (dock.GlobalAvgPool, dock.GlobalMaxPool):
        if len(shape) < 3:
            raise ShapeError(f"{kind.__name__} takes (N, C, *spatial); got shape {shape}")
    elif kind is dock.Embedding:
        dtype = str(x.dtype).removeprefix("torch.")
        if not dtype.startswith(("int", "uint")):
            raise DtypeError(f"Embedding takes integer ids; got dtype {dtype}")


def _rank(layer: Any, shape: tuple[int, ...], rank: int, form: str) -> None:
    if len(shape) != rank:
        name = type(layer).__name__
        raise ShapeError(f"{name} takes {form}, rank {rank}; got shape {shape}")


def _channels(layer: Any, shape: tuple[int, ...], expected: int) -> None:
    if len(shape) < 2 or shape[1] != expected:
        name = type(layer).__name__
        raise ShapeError(f"{name} takes {expected} channels on axis 1; got shape {shape}")
