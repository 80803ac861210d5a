"""Conv (1, 2 or 3 spatial axes) and the 2-D ConvTranspose, with their channel checks."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dualtrain.craft.checks import check_channels, check_not_empty, check_rank, check_windows
from dualtrain.craft.padding import check_padding, resolve_padding, to_tuple
from dualtrain.craft.params import ParamSpec
from dualtrain.craft.specs.base import Layer, flags, is_int, items, positive, spatial_ndim
from dualtrain.errors import ShapeError, bad_argument

__all__ = ["Conv", "ConvTranspose"]


def _check_groups(spec: Any) -> None:
    """Positive channel counts and groups, and groups dividing both (Conv, ConvTranspose)."""
    positive(spec, "in_channels", "out_channels", "groups")
    flags(spec, "bias")
    if spec.in_channels % spec.groups or spec.out_channels % spec.groups:
        raise bad_argument(
            "groups",
            spec.groups,
            f"a divisor of in_channels={spec.in_channels} and out_channels={spec.out_channels}",
        )


def _weight_and_bias(spec: Any, rows: int, per_group: int) -> dict[str, ParamSpec]:
    """The weight ``(rows, per_group / groups, *kernel)`` and the bias (if any), as torch.

    Both uniform in 1/sqrt(fan_in), fan_in the weight's size past its first axis (torch's
    rule, for a convolution and a transposed one alike).
    """
    weight = (rows, per_group // spec.groups, *spec.kernel)
    bound = 1 / math.sqrt(math.prod(weight[1:]))
    out = {"weight": ParamSpec(weight, "uniform", bound)}
    if spec.bias:
        out["bias"] = ParamSpec((spec.out_channels,), "uniform", bound)
    return out


def _plain(value: Any) -> Any:
    """Checked padding with NumPy ints as Python ints and lists as tuples."""
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return int(value)


@dataclasses.dataclass(frozen=True, eq=False)
class _Convolution(Layer):
    """The fields Conv and ConvTranspose begin with, in torch's order; each adds its own."""

    input_dtypes = "params"  # see dualtrain.craft.checks.check_dtype

    in_channels: int
    out_channels: int
    kernel: Any
    stride: Any = 1
    padding: Any = 0


@dataclasses.dataclass(frozen=True, eq=False)
class Conv(_Convolution):
    """Convolution over 1, 2 or 3 spatial axes: ``(N, in, *S) -> (N, out, *S')``.

    `padding` is an int, one int per axis, ``(low, high)`` pairs per axis, ``"valid"`` (none)
    or ``"same"`` (``ceil(S / stride)`` outputs, the odd element on the high side). `ndim`
    comes from a tuple `kernel`, else defaults to 2.
    """

    dilation: Any = 1
    groups: int = 1
    bias: bool = True
    ndim: Any = None

    def __post_init__(self) -> None:
        _check_groups(self)
        nd = spatial_ndim(self.kernel, self.ndim)
        object.__setattr__(self, "ndim", int(nd))
        for name in ("kernel", "stride", "dilation"):
            object.__setattr__(self, name, to_tuple(getattr(self, name), nd, name))
        check_padding(self.padding, nd)
        object.__setattr__(self, "padding", _plain(self.padding))

    def params(self) -> dict[str, ParamSpec]:
        return _weight_and_bias(self, self.out_channels, self.in_channels)

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes ``(N, in_channels, *spatial)`` with room for one window per axis."""
        name, shape = type(self).__name__, tuple(x.shape)
        check_rank(name, shape, 2 + self.ndim, f"(N, C, {self.ndim} spatial axes)")
        check_channels(name, shape, self.in_channels)
        # torch convolves an empty batch or channel axis, never an empty spatial one (even
        # where padding makes room for a window)
        check_not_empty(name, shape, range(2, 2 + self.ndim), "spatial axes")
        pads = resolve_padding(self.padding, shape[2:], self.kernel, self.stride, self.dilation)
        check_windows(name, shape, pads, self.kernel, self.dilation)


@dataclasses.dataclass(frozen=True, eq=False)
class ConvTranspose(_Convolution):
    """2-D transposed convolution, torch's semantics: ``(N, in, H, W) -> (N, out, H', W')``.

    ``H' = (H - 1)·stride - 2·padding + dilation·(k - 1) + output_padding + 1``.
    """

    output_padding: Any = 0
    dilation: Any = 1
    groups: int = 1
    bias: bool = True

    def __post_init__(self) -> None:
        _check_groups(self)
        for name in ("kernel", "stride", "dilation"):
            object.__setattr__(self, name, to_tuple(getattr(self, name), 2, name))
        for name in ("padding", "output_padding"):
            value = getattr(self, name)
            pair = (value, value) if is_int(value) else items(value)
            if len(pair) != 2 or not all(is_int(v) and v >= 0 for v in pair):
                raise bad_argument(name, value, "a non-negative int or 2 of them")
            object.__setattr__(self, name, tuple(int(v) for v in pair))
        for op, s, d in zip(self.output_padding, self.stride, self.dilation, strict=True):
            if op >= max(s, d):
                raise bad_argument(
                    "output_padding", self.output_padding, "smaller than stride or dilation"
                )

    def params(self) -> dict[str, ParamSpec]:
        return _weight_and_bias(self, self.in_channels, self.out_channels)

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes ``(N, in_channels, H, W)`` whose output has at least one pixel per axis."""
        name, shape = type(self).__name__, tuple(x.shape)
        check_rank(name, shape, 4, "(N, C, H, W)")
        check_channels(name, shape, self.in_channels)
        out = tuple(
            (n - 1) * s - 2 * p + d * (k - 1) + op + 1
            for n, s, p, d, k, op in zip(
                shape[2:], self.stride, self.padding, self.dilation, self.kernel,
                self.output_padding, strict=True,
            )
        )  # fmt: skip
        if any(n < 1 for n in shape[2:]) or any(o < 1 for o in out):
            raise ShapeError(
                f"ConvTranspose gives no output for input shape {shape}: its output size would "
                f"be {out}"
            )
