"""Pooling: MaxPool and AvgPool over windows, GlobalAvgPool and GlobalMaxPool over all axes."""

from __future__ import annotations

import dataclasses
from typing import Any

from dualtrain.craft.checks import check_not_empty, check_rank, check_windows
from dualtrain.craft.padding import to_tuple
from dualtrain.craft.specs.base import Layer, is_int, items, spatial_ndim
from dualtrain.errors import ShapeError, bad_argument

__all__ = ["AvgPool", "GlobalAvgPool", "GlobalMaxPool", "MaxPool"]


@dataclasses.dataclass(frozen=True, eq=False)
class _Pool(Layer):
    input_dtypes = "float"  # see dualtrain.craft.checks.check_dtype

    kernel: Any
    stride: Any = None
    padding: Any = 0
    ndim: Any = None

    def __post_init__(self) -> None:
        nd = spatial_ndim(self.kernel, self.ndim)
        object.__setattr__(self, "ndim", int(nd))
        object.__setattr__(self, "kernel", to_tuple(self.kernel, nd, "kernel"))
        stride = self.kernel if self.stride is None else self.stride
        object.__setattr__(self, "stride", to_tuple(stride, nd, "stride"))
        pads = (self.padding,) * nd if is_int(self.padding) else items(self.padding)
        if any(isinstance(p, (tuple, list)) for p in pads):
            # torch's pools pad both sides alike; uneven padding is a pad before the pool
            raise bad_argument(
                "padding",
                self.padding,
                f"one int per axis ({nd} of them, each at most kernel/2; pooling pads both "
                "sides alike, MaxPool with -inf), not (low, high) pairs: pad first with "
                "dock.pad(x, pairs, value) and pool with padding=0",
            )
        ok = len(pads) == nd and all(is_int(p) and p >= 0 for p in pads)
        if not ok or any(2 * p > k for p, k in zip(pads, self.kernel, strict=True)):
            raise bad_argument(
                "padding",
                self.padding,
                f"a non-negative int, or {nd} of them, each at most kernel/2",
            )
        object.__setattr__(self, "padding", tuple(int(p) for p in pads))

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes ``(N, C, *spatial)`` with room for one window per axis."""
        name, shape = type(self).__name__, tuple(x.shape)
        check_rank(name, shape, 2 + self.ndim, f"(N, C, {self.ndim} spatial axes)")
        # torch pools nothing empty but the batch: not channels, not a spatial axis (even
        # one that padding would give room)
        check_not_empty(name, shape, range(1, 2 + self.ndim), "channel and spatial axes")
        pads = tuple((p, p) for p in self.padding)
        check_windows(name, shape, pads, self.kernel, (1,) * self.ndim)


@dataclasses.dataclass(frozen=True, eq=False)
class MaxPool(_Pool):
    """Max over windows: ``(N, C, *S) -> (N, C, *S')``; padding counts as -inf."""


@dataclasses.dataclass(frozen=True, eq=False)
class AvgPool(_Pool):
    """Mean over windows: ``(N, C, *S) -> (N, C, *S')``; padding counts as zeros."""


@dataclasses.dataclass(frozen=True, eq=False)
class _GlobalPool(Layer):
    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Takes ``(N, C, *spatial)`` with at least one spatial axis."""
        shape = tuple(x.shape)
        if len(shape) < 3:
            raise ShapeError(f"{type(self).__name__} takes (N, C, *spatial); got shape {shape}")
        check_not_empty(type(self).__name__, shape, range(2, len(shape)), "spatial axis")


@dataclasses.dataclass(frozen=True, eq=False)
class GlobalAvgPool(_GlobalPool):
    """Mean over every spatial axis: ``(N, C, *S) -> (N, C)``."""

    input_dtypes = "float"  # see dualtrain.craft.checks.check_dtype


@dataclasses.dataclass(frozen=True, eq=False)
class GlobalMaxPool(_GlobalPool):
    """Max over every spatial axis: ``(N, C, *S) -> (N, C)``."""
