"""Input checks for dock layers, shared by every backend so errors read the same.

Each binding calls `check(layer, x, train=...)` before running a layer, so torch, JAX and
the NumPy reference refuse the same inputs with the same error class and message. Under JAX
tracing the shapes are static, so the check runs once, at trace time; values (Embedding
ids) are checked only where they are concrete (see `check_ids`).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from dualtrain.craft import dock
from dualtrain.craft.padding import resolve_padding
from dualtrain.errors import DtypeError, OutOfRangeError, ShapeError

__all__ = ["check", "check_ids"]


def check(layer: Any, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
    """Raises ShapeError/DtypeError naming the layer, what it takes and what it got.

    Args:
        layer: the dock layer about to run.
        x: its first input.
        rest: its other inputs (a Reshape's shape, given at call time).
        train: training mode (BatchNorm then needs more than one value per channel).
        kwargs: its keyword arguments (``shape=`` of a Reshape).
    """
    kind = type(layer)
    shape = tuple(x.shape)
    if kind is dock.Dense:
        if not shape or shape[-1] != layer.in_features:
            raise ShapeError(f"Dense takes (..., {layer.in_features}); got shape {shape}")
    elif kind in (dock.Conv, dock.MaxPool, dock.AvgPool):
        _rank(layer, shape, 2 + layer.ndim, f"(N, C, {layer.ndim} spatial axes)")
        if kind is dock.Conv:
            _channels(layer, shape, layer.in_channels)
        _windows_fit(layer, shape)
    elif kind is dock.ConvTranspose:
        _rank(layer, shape, 4, "(N, C, H, W)")
        _channels(layer, shape, layer.in_channels)
        _transpose_fits(layer, shape)
    elif kind is dock.BatchNorm:
        _channels(layer, shape, layer.num_features)
        if train and math.prod(shape) // shape[1] == 1:
            raise ShapeError(
                "BatchNorm in training needs more than 1 value per channel (the batch "
                f"variance of one value is undefined); got shape {shape}"
            )
    elif kind is dock.LayerNorm:
        k = len(layer.shape)
        if shape[-k:] != layer.shape:
            raise ShapeError(
                f"LayerNorm over {layer.shape} takes (..., *{layer.shape}); got {shape}"
            )
    elif kind in (dock.GlobalAvgPool, dock.GlobalMaxPool):
        if len(shape) < 3:
            raise ShapeError(f"{kind.__name__} takes (N, C, *spatial); got shape {shape}")
    elif kind is dock.Flatten:
        rank = max(len(shape), 1)  # a 0-d input flattens like a 1-d one, as in torch
        if not -rank <= layer.start < rank:
            raise ShapeError(
                f"Flatten(start={layer.start}) needs an axis in [{-rank}, {rank - 1}] of the "
                f"input; got shape {shape}"
            )
    elif kind is dock.Reshape:
        _reshape_fits(rest[0] if rest else kwargs.get("shape", layer.shape), shape)
    elif kind is dock.Embedding:
        dtype = str(x.dtype).removeprefix("torch.")
        if not dtype.startswith(("int", "uint")):
            raise DtypeError(f"Embedding takes integer ids; got dtype {dtype}")
        if concrete(x):
            check_ids(x, layer.num_embeddings, "Embedding ids")


def concrete(x: Any) -> bool:
    """Whether `x`'s values can be read now: not a JAX tracer, not inside torch.compile.

    Checked through ``sys.modules``: the core never imports a framework itself.
    """
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.core.Tracer):
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and torch.compiler.is_compiling())


def check_ids(ids: Any, num: int, name: str) -> None:
    """Raises OutOfRangeError naming the first id outside ``[0, num)`` and its position.

    `ids` is any integer array (NumPy, torch, JAX); a device array is read once to the host
    for its minimum and maximum.
    """
    size = math.prod(tuple(ids.shape))
    if not size:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo >= 0 and hi < num:
        return
    flat = np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids).ravel()
    bad = int(np.flatnonzero((flat < 0) | (flat >= num))[0])
    position = tuple(int(i) for i in np.unravel_index(bad, tuple(ids.shape)))
    raise OutOfRangeError(
        f"{name} holds id {int(flat[bad])} at position {position}; expected ids in [0, {num})"
    )


def _rank(layer: Any, shape: tuple[int, ...], rank: int, form: str) -> None:
    if len(shape) != rank:
        name = type(layer).__name__
        raise ShapeError(f"{name} takes {form}, rank {rank}; got shape {shape}")


def _channels(layer: Any, shape: tuple[int, ...], expected: int) -> None:
    if len(shape) < 2 or shape[1] != expected:
        name = type(layer).__name__
        raise ShapeError(f"{name} takes {expected} channels on axis 1; got shape {shape}")


def _windows_fit(layer: Any, shape: tuple[int, ...]) -> None:
    """Each padded spatial axis holds at least one (dilated) window: an output size >= 1."""
    spatial = shape[2:]
    dilation = getattr(layer, "dilation", (1,) * layer.ndim)
    if isinstance(layer, dock.Conv):
        pads = resolve_padding(layer.padding, spatial, layer.kernel, layer.stride, dilation)
    else:
        pads = tuple((p, p) for p in layer.padding)
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(spatial, pads, strict=True))
    span = tuple(d * (k - 1) + 1 for k, d in zip(layer.kernel, dilation, strict=True))
    if any(p < s for p, s in zip(padded, span, strict=True)):
        raise ShapeError(
            f"{type(layer).__name__} gives no output for input shape {shape}: the padded "
            f"spatial size {padded} is smaller than the (dilated) kernel {span}"
        )


def _reshape_fits(target: Any, shape: tuple[int, ...]) -> None:
    """`target` is a shape the input's values fill exactly (one -1 inferred at most)."""
    size = math.prod(shape)
    items = tuple(target) if isinstance(target, (tuple, list)) else None
    ok = items is not None and all(
        isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= -1 for n in items
    )
    if ok and items is not None:
        known = math.prod(int(n) for n in items if n != -1)
        holes = sum(1 for n in items if n == -1)
        ok = (holes == 0 and known == size) or (holes == 1 and known > 0 and size % known == 0)
    if not ok:
        raise ShapeError(
            f"Reshape cannot make shape {target!r} from an input of shape {shape} ({size} values)"
        )


def _transpose_fits(layer: dock.ConvTranspose, shape: tuple[int, ...]) -> None:
    out = tuple(
        (n - 1) * s - 2 * p + d * (k - 1) + op + 1
        for n, s, p, d, k, op in zip(
            shape[2:], layer.stride, layer.padding, layer.dilation, layer.kernel,
            layer.output_padding, strict=True,
        )
    )  # fmt: skip
    if any(n < 1 for n in shape[2:]) or any(o < 1 for o in out):
        raise ShapeError(
            f"ConvTranspose gives no output for input shape {shape}: its output size would be {out}"
        )
