"""Each dock spec as a native torch module, the layout map, and the functional ops.

The modules are torch's own (``nn.Linear``, ``nn.Conv2d``, ``nn.BatchNorm2d``'s base...), so
hooks, ``state_dict``, ``torch.compile`` and DDP see ordinary modules. Their parameters sit
at the neutral names, in the canonical layouts, which are torch's: no mapping is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from dualtrain.craft import dock
from dualtrain.craft.padding import resolve_padding

__all__ = ["OPS", "build"]

_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_MAX = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}
_AVG = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}


def _fixed_pads(spec: dock.Conv) -> tuple[tuple[int, int], ...] | None:
    """(low, high) per axis when they do not depend on the input's size, else None.

    Only ``"same"`` at a stride above 1 depends on it: at stride 1 its total is
    ``dilation * (kernel - 1)`` whatever the size.
    """
    if spec.padding == "same" and any(s != 1 for s in spec.stride):
        return None
    return resolve_padding(spec.padding, (1,) * spec.ndim, spec.kernel, spec.stride, spec.dilation)


def same_pads(sizes: Any, spec: dock.Conv) -> list[tuple[Any, Any]]:
    """``"same"``'s (low, high) per axis for spatial `sizes`, as `autopad` computes them.

    Plain arithmetic, so it runs on ints and on the size tensors an ONNX export traces
    (the exported graph then pads any input size as eager does, not the example's).
    """
    pads = []
    for n, k, s, d in zip(sizes, spec.kernel, spec.stride, spec.dilation, strict=True):
        out = (n + s - 1) // s
        need = (out - 1) * s + d * (k - 1) + 1 - n
        total = (need + abs(need)) // 2  # max(need, 0) for ints and tensors alike
        pads.append((total // 2, total - total // 2))
    return pads


def _conv(spec: dock.Conv) -> nn.Module:
    fixed = _fixed_pads(spec)
    symmetric = fixed is not None and all(lo == hi for lo, hi in fixed)
    base: Any = _CONV[spec.ndim]  # a class chosen at run time: mypy takes it as Any

    class Conv(base):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not symmetric:  # asymmetric pads, or "same" at stride > 1: pad first
                pads = fixed if fixed is not None else same_pads(x.shape[2:], spec)
                x = F.pad(x, [p for lo_hi in reversed(pads) for p in lo_hi])
            return super().forward(x)

    Conv.__name__ = Conv.__qualname__ = base.__name__
    return Conv(
        spec.in_channels, spec.out_channels, spec.kernel, spec.stride,
        padding=tuple(lo for lo, _ in fixed) if symmetric and fixed else 0,
        dilation=spec.dilation, groups=spec.groups, bias=spec.bias,
    )  # fmt: skip


class BatchNorm(nn.modules.batchnorm._BatchNorm):
    """torch's batch norm for inputs of any rank >= 2 (BatchNorm1d/2d/3d differ only there)."""

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"BatchNorm takes (N, C, ...); got shape {tuple(x.shape)}")


class Reshape(nn.Module):
    """``x.reshape(shape)``, the shape given at construction or at call time."""

    def __init__(self, shape: tuple[int, ...] | None) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        target = shape if shape is not None else self.shape
        return x.reshape(cast("tuple[int, ...]", target))  # the spec's check refused None


class GlobalPool(nn.Module):
    """Mean or max over every spatial axis: ``(N, C, *S) -> (N, C)``."""

    def __init__(self, reduce: str) -> None:
        super().__init__()
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(2)
        return flat.mean(-1) if self.reduce == "mean" else flat.amax(-1)


def _batch_norm(spec: dock.BatchNorm) -> nn.Module:
    return BatchNorm(spec.num_features, spec.eps, spec.momentum, affine=spec.affine)


BUILDERS: dict[type, Callable[[Any], nn.Module]] = {
    dock.Dense: lambda s: nn.Linear(s.in_features, s.out_features, bias=s.bias),
    dock.Conv: _conv,
    dock.ConvTranspose: lambda s: nn.ConvTranspose2d(
        s.in_channels,
        s.out_channels,
        s.kernel,
        s.stride,
        s.padding,
        s.output_padding,
        groups=s.groups,
        bias=s.bias,
        dilation=s.dilation,
    ),
    dock.MaxPool: lambda s: _MAX[s.ndim](s.kernel, s.stride, s.padding),
    dock.AvgPool: lambda s: _avg_pool(s),
    dock.GlobalAvgPool: lambda s: GlobalPool("mean"),
    dock.GlobalMaxPool: lambda s: GlobalPool("max"),
    dock.Reshape: lambda s: Reshape(s.shape),
    dock.Flatten: lambda s: nn.Flatten(s.start),
    dock.BatchNorm: _batch_norm,
    dock.LayerNorm: lambda s: nn.LayerNorm(s.shape, s.eps, elementwise_affine=s.affine),
    dock.Dropout: lambda s: nn.Dropout(s.p),
    dock.Embedding: lambda s: nn.Embedding(s.num_embeddings, s.dim),
}


def _avg_pool(spec: dock.AvgPool) -> nn.Module:
    if spec.ndim != 3:
        return _AVG[spec.ndim](spec.kernel, spec.stride, spec.padding, count_include_pad=True)

    class AvgPool3d(nn.AvgPool3d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # torch has no CPU avg_pool3d for float16 / bfloat16, which dock.AvgPool takes
            # (as JAX and the reference do): pool in float32 there, round the result once.
            if x.is_cpu and x.dtype in (torch.float16, torch.bfloat16):
                return super().forward(x.float()).to(x.dtype)
            return super().forward(x)

    AvgPool3d.__qualname__ = "AvgPool3d"
    return AvgPool3d(spec.kernel, spec.stride, spec.padding, count_include_pad=True)


def build(spec: Any) -> nn.Module:
    """The torch module for dock layer `spec` (parameters uninitialized; realize fills them)."""
    return BUILDERS[type(spec)](spec)


_NO_CLASS = -(2**63)  # F.cross_entropy's ignore_index: a label no tensor can hold

OPS: dict[str, Callable[..., Any]] = {
    "relu": torch.relu,
    "gelu": F.gelu,  # exact (erf) by default, as the reference
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softmax": lambda x, axis: torch.softmax(x, axis),
    "log_softmax": lambda x, axis: torch.log_softmax(x, axis),
    "concat": lambda xs, axis: torch.cat(xs, axis),
    "add": torch.add,
    "mean": lambda x, axis, keepdims: (
        x.mean()
        if axis is None and not keepdims
        else x.mean(dim=tuple(range(x.ndim)) if axis is None else axis, keepdim=keepdims)
    ),
    "matmul": torch.matmul,
    # F.pad takes the last axis first
    "pad": lambda x, pads, value: F.pad(
        x, [s for pair in reversed(pads) for s in pair], value=value
    ),
    # no ignore_index: every label counts, and one out of range raises as under NumPy
    "cross_entropy": lambda logits, labels: F.cross_entropy(
        logits, labels.long(), ignore_index=_NO_CLASS
    ),
    "accuracy": lambda logits, labels: (
        (logits.argmax(-1) == labels)
        .to(logits.dtype if logits.is_floating_point() else torch.float32)
        .mean()
    ),
}
