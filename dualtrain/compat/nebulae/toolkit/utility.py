"""Nebulae's ``nebulae.toolkit.utility``: ``autoPad`` and ``GPUtil``."""

from __future__ import annotations

from collections.abc import Sequence

from dualtrain.cockpit.gputil import GPUtil
from dualtrain.craft.padding import autoPad as _same_pads  # noqa: N813
from dualtrain.errors import bad_argument

__all__ = ["GPUtil", "autoPad"]


def _ints(name: str, value: int | Sequence[int], dim: int) -> list[int]:
    values = [value] * dim if isinstance(value, int) else list(value)
    if len(values) != dim or not all(isinstance(v, int) and v >= 1 for v in values):
        raise bad_argument(name, value, f"a positive int or {dim} of them")
    return values


def autoPad(  # noqa: N802 - Nebulae's name
    in_size: Sequence[int] | None,
    kernel: Sequence[int],
    stride: int | Sequence[int] = 1,
    dilation: int | Sequence[int] = 1,
) -> list[int]:
    """The padding that keeps ``ceil(in / stride)`` outputs, flat, last axis first.

    That is ``F.pad``'s order, which Nebulae's Conv and pools take.

    Args:
        in_size: the input's spatial size ``(h, w)``; None or () when the stride divides it.
        kernel: the kernel's size per axis (a tuple, as Nebulae's layers take).
        stride: an int, or one per axis.
        dilation: an int, or one per axis.

    Example:
        >>> autoPad((32, 32), (3, 3), 2)
        [0, 1, 0, 1]
    """
    if not isinstance(kernel, (tuple, list)) or not kernel:
        raise bad_argument("kernel", kernel, "a tuple of kernel sizes, one per axis")
    dim = len(kernel)
    if in_size is not None and len(in_size) > 0:
        return list(_same_pads(tuple(in_size), tuple(kernel), stride, dilation))
    strides, dilations = _ints("stride", stride, dim), _ints("dilation", dilation, dim)
    out: list[int] = []
    for d in reversed(range(dim)):
        margin = max(kernel[d] + (dilations[d] - 1) * (kernel[d] - 1) - strides[d], 0)
        out += [margin // 2, margin - margin // 2]
    return out
