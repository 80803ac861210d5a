"""Padding arithmetic for convolutions and pooling: `autopad`, `autoPad`, "same"/"valid".

Two forms of the same "same" padding: `autopad` gives ``((low, high), ...)`` per spatial axis
in axis order, the form the dock layers, ``np.pad`` and ``jnp.pad`` (after ``(0, 0)`` for the
batch and channel axes) and ``lax.conv_general_dilated`` take; `autoPad` gives Nebulae's flat
tuple, last axis first, ``(left, right, top, bottom, front, back)``, the form
``torch.nn.functional.pad`` takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["Pads", "autoPad", "autopad", "resolve_padding", "to_tuple"]

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
    # The number of axes is the longest sequence given (1 if all are ints); anything that is
    # neither an int nor a tuple/list is refused by to_tuple below, naming the argument.
    ndim = max(1, *(len(_items(v)) for v in (in_size, kernel, stride, dilation)))
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


def autoPad(  # noqa: N802 - Nebulae's spelling, kept for migrating code
    in_size: int | Sequence[int],
    kernel: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    dilation: int | Sequence[int] = 1,
) -> tuple[int, ...]:
    """`autopad` as one flat tuple, last axis first: what ``torch.nn.functional.pad`` takes.

    ``(left, right, top, bottom, front, back)`` for a 3-d input ``(D, H, W)``;
    ``(left, right, top, bottom)`` for ``(H, W)``. ``F.pad(x, autoPad(x.shape[2:], k, s, d))``
    followed by a convolution or pooling with that kernel, stride and dilation and no
    padding of its own gives ``ceil(in / stride)`` outputs per axis (the input's size at
    stride 1). The arguments are `autopad`'s, and so are the errors.

    Example:
        >>> autoPad((32, 40), (3, 5))
        (2, 2, 1, 1)

    Returns:
        ``(low, high)`` of the last axis, then of the one before, and so on.
    """
    return tuple(
        side for pair in reversed(autopad(in_size, kernel, stride, dilation)) for side in pair
    )


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
