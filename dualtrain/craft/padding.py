"""Padding arithmetic for convolutions and pooling: `autopad` and "same"/"valid" resolution."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["Pads", "autopad", "resolve_padding", "to_tuple"]

Pads = tuple[tuple[int, int], ...]  # (low, high) per spatial axis, in axis order


def to_tuple(value: int | Sequence[int], ndim: int, name: str) -> tuple[int, ...]:
    """`value` as an `ndim`-tuple of positive ints (an int repeats)."""
    items: tuple[Any, ...] = (value,) * ndim if _is_int(value) else _items(value)
    if len(items) != ndim or not all(_is_int(v) and v > 0 for v in items):
        raise bad_argument(name, value, f"a positive int or {ndim} positive ints")
    return tuple(int(v) for v in items)


def _is_int(value: object) -> bool:
    # bools are ints to Python, never a size; NumPy ints are sizes like Python's.
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _items(value: object) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else ()


def autopad(
    in_size: int | Sequence[int],
    kernel: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    dilation: int | Sequence[int] = 1,
) -> Pads:
    """The (low, high) padding per axis giving ``ceil(in_size / stride)`` outputs.

    At stride 1 that keeps the size. Odd totals put the extra element on the high side
    (TensorFlow's "SAME"). Works for any kernel shape and any number of axes.

    Args:
        in_size: the input's spatial size, an int or one per axis.
        kernel: the window size, an int or one per axis.
        stride: the step, an int or one per axis.
        dilation: the spacing of window elements, an int or one per axis.

    Returns:
        ``((low, high), ...)`` in axis order (height before width).
    """
    ndim = 1 if isinstance(in_size, int) else len(in_size)
    for value in (kernel, stride, dilation):
        if not isinstance(value, int):
            ndim = max(ndim, len(value))
    sizes = to_tuple(in_size, ndim, "in_size")
    kernels = to_tuple(kernel, ndim, "kernel")
    strides = to_tuple(stride, ndim, "stride")
    dilations = to_tuple(dilation, ndim, "dilation")
    pads = []
    for n, k, s, d in zip(sizes, kernels, strides, dilations, strict=True):
        out = -(-n // s)
        total = max(0, (out - 1) * s + d * (k - 1) + 1 - n)
        pads.append((total // 2, total - total // 2))
    return tuple(pads)


def resolve_padding(
    padding: Any,
    in_size: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
) -> Pads:
    """Explicit (low, high) pads from a layer's `padding` for an input of `in_size`."""
    ndim = len(kernel)
    if padding == "valid":
        return ((0, 0),) * ndim
    if padding == "same":
        return autopad(tuple(in_size), kernel, stride, dilation)
    if isinstance(padding, int):
        return ((padding, padding),) * ndim
    pads = tuple(padding)
    if all(isinstance(p, int) for p in pads):
        return tuple((int(p), int(p)) for p in pads)
    return tuple((int(lo), int(hi)) for lo, hi in pads)


def check_padding(padding: object, ndim: int) -> None:
    """Raises the house error unless `padding` is a valid padding for `ndim` axes."""
    ok = (isinstance(padding, str) and padding in ("same", "valid")) or (
        _is_int(padding) and padding >= 0  # type: ignore[operator]
    )
    if not ok and isinstance(padding, (tuple, list)) and len(padding) == ndim:
        ok = all(_is_int(p) and p >= 0 for p in padding) or all(
            isinstance(p, (tuple, list)) and len(p) == 2 and all(_is_int(v) and v >= 0 for v in p)
            for p in padding
        )
    if not ok:
        raise bad_argument(
            "padding", padding, f"'same', 'valid', a non-negative int, or {ndim} of them"
        )
