"""torchmb's batched layers (``torchmb.layers``): Linear, Conv2d, BatchNorm2d and GroupNorm.

Each holds `batch` members' tensors under its torch layer's names, ``[batch, *shape]``, and
its forward takes and returns merged ``(b g)`` tensors (row ``b * batch + g`` is sample b of
member g). The members go through one call of torch's own kernel: a batched matrix product
for Linear; for the others the merged rows are viewed as ``[B, batch * C, ...]``, the
members' channels side by side, so Conv2d is one grouped convolution and the norms are one
batch norm over ``batch * C`` channels or one group norm over ``batch * groups`` groups. Each
channel (or group) there is computed by the kernel that computes it in the member's own
layer, on the same values in the same order: the norms equal torch's ``nn.BatchNorm2d`` and
``nn.GroupNorm`` per member bit for bit, running statistics and gradients included.

Unlike torchmb, importing this module registers nothing: `BatchModule` runs these layers'
torch counterparts through ``torch.func`` already. ``register_batch_module(BatchConv2d)``
makes one a fast path there, checked against the generic path on its first call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Self, cast

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from dualtrain.batching import members
from dualtrain.errors import ArgumentError, ShapeError, bad_argument
from dualtrain.validate import check_finite, check_int
from dualtrain_torch.compat.torchmb.base import AbstractBatchModule
from dualtrain_torch.compat.torchmb.functional import inner_batch_size
from dualtrain_torch.compat.torchmb.types import IntOrInts

__all__ = ["BatchBatchNorm2d", "BatchConv2d", "BatchGroupNorm", "BatchLinear"]


def _stacked(p: torch.Tensor, batch: int) -> nn.Parameter:
    """`batch` copies of `p` as one ``[batch, *shape]`` parameter."""
    return nn.Parameter(p.detach().unsqueeze(0).repeat_interleave(batch, 0).contiguous())


def _maybe_stacked(p: torch.Tensor | None, batch: int) -> nn.Parameter | None:
    return None if p is None else _stacked(p, batch)


def _redraw(target: AbstractBatchModule, layer: nn.Module) -> None:
    """Draws every member's parameters afresh with `layer`'s own ``reset_parameters``."""
    own = dict(target.named_parameters())
    with torch.no_grad():
        for g in range(target.batch):
            layer.reset_parameters()  # type: ignore[operator]
            for name, p in layer.named_parameters():
                own[name][g].copy_(p)


def _copy_into_every_member(target: AbstractBatchModule, module: nn.Module) -> None:
    """Makes every member of `target` a copy of `module`'s tensors (dtype and device too)."""
    first = next(_tensors(module), None)
    if first is not None and first.is_floating_point():
        target.to(device=first.device, dtype=first.dtype)
    own = dict(target.named_parameters()) | dict(target.named_buffers())
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            own[name].copy_(t)  # broadcast over the members


def _tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


class _CopiedLayer(AbstractBatchModule):
    """A batched torch layer whose ``from_module`` copies one layer into every member.

    Each subclass names the layer's constructor arguments (`_arguments`), read off a
    `base_class` instance, in its own constructor's order (`batch` comes last).
    """

    @staticmethod
    def _arguments(layer: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    @classmethod
    def from_module(cls, module: nn.Module, batch: int) -> Self:
        """`batch` copies of the `base_class` layer `module` (its tensors in every member)."""
        if not isinstance(module, cls.base_class):
            raise bad_argument("module", module, f"an nn.{cls.base_class.__name__}")
        out = cls(*cls._arguments(module), batch)  # type: ignore[call-arg]  # a subclass's own
        _copy_into_every_member(out, module)
        return out


def _channels_side_by_side(
    x: torch.Tensor, batch: int, channels: int, layer: str, images: bool
) -> torch.Tensor:
    """Merged ``[(b g), C, ...]`` as ``[B, g * C, ...]`` (a view of contiguous rows).

    `images`: the layer takes only ``[(b g), C, H, W]``.
    """
    if not isinstance(x, torch.Tensor):
        raise bad_argument("x", type(x).__name__, "a tensor")
    if x.ndim < 2 or x.shape[1] != channels or (images and x.ndim != 4):
        shape = "[(B*batch), C, H, W]" if images else "[(B*batch), C, ...]"
        raise ShapeError(
            f"{layer} takes merged rows {shape} with C={channels}; got shape {tuple(x.shape)}"
        )
    b = inner_batch_size(x, batch)
    return x.reshape(b, batch * channels, *x.shape[2:])


class BatchLinear(_CopiedLayer):
    """`batch` ``nn.Linear`` layers: ``weight [batch, out, in]``, ``bias [batch, out]``.

    Each member starts as torch's initializer draws it (torchmb left the memory
    uninitialized); ``bias=False`` leaves the bias out (torchmb kept one regardless).

    Args:
        in_features, out_features, bias: as for ``nn.Linear``.
        batch: the member count.
    """

    base_class = nn.Linear
    weight: nn.Parameter
    bias: nn.Parameter | None

    @staticmethod
    def _arguments(linear: Any) -> tuple[Any, ...]:
        return linear.in_features, linear.out_features, linear.bias is not None

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, batch: int = 1
    ) -> None:
        super().__init__(batch)
        self.in_features = check_int("in_features", in_features, minimum=0)
        self.out_features = check_int("out_features", out_features, minimum=0)
        layer = nn.Linear(self.in_features, self.out_features, members.check_flag("bias", bias))
        self.weight = _stacked(layer.weight, self.batch)
        self.bias = _maybe_stacked(layer.bias, self.batch)
        self.reset_parameters()

    def _layer(self) -> nn.Linear:
        return nn.Linear(self.in_features, self.out_features, self.bias is not None)

    def reset_parameters(self) -> None:
        """Draws every member afresh, each as ``nn.Linear`` draws one."""
        _redraw(self, self._layer())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Merged rows ``[(B*batch), ..., in]`` -> ``[(B*batch), ..., out]``."""
        if not isinstance(x, torch.Tensor):
            raise bad_argument("x", type(x).__name__, "a tensor")
        if x.ndim < 2 or x.shape[-1] != self.in_features:
            raise ShapeError(
                f"BatchLinear takes merged rows [(B*batch), ..., in] with in="
                f"{self.in_features}; got shape {tuple(x.shape)}"
            )
        b = inner_batch_size(x, self.batch)
        middle, t = x.shape[1:-1], x.shape[1:-1].numel()
        # [(b g), ..., in] -> [g, (b ...), in]: each member's rows as one matrix.
        rows = x.reshape(b, self.batch, t, self.in_features).transpose(0, 1)
        rows = rows.reshape(self.batch, b * t, self.in_features)
        w = self.weight.transpose(1, 2)
        if self.bias is None:
            y = torch.bmm(rows, w)
        else:
            y = torch.baddbmm(self.bias.unsqueeze(1), rows, w)
        y = y.reshape(self.batch, b, t, self.out_features).transpose(0, 1)
        return y.reshape(b * self.batch, *middle, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, batch={self.batch}"
        )


class BatchConv2d(_CopiedLayer):
    """`batch` ``nn.Conv2d`` layers, run as one convolution with ``batch * groups`` groups.

    The weight is ``[batch, out, in / groups, kh, kw]`` (``nn.Conv2d``'s per member; torchmb
    dropped the ``/ groups``), the bias ``[batch, out]``. String padding (``"same"``,
    ``"valid"``) and every ``padding_mode`` work as in ``nn.Conv2d`` (torchmb refused the
    first and padded with zeros whatever the second said).

    Args:
        in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
            padding_mode: as for ``nn.Conv2d``.
        batch: the member count.

    Raises:
        ArgumentError: a bad argument (``nn.Conv2d``'s own checks included).
    """

    base_class = nn.Conv2d
    weight: nn.Parameter
    bias: nn.Parameter | None

    @staticmethod
    def _arguments(conv: Any) -> tuple[Any, ...]:
        return (
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            conv.stride,
            conv.padding,
            conv.dilation,
            conv.groups,
            conv.bias is not None,
            conv.padding_mode,
        )

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOrInts,
        stride: IntOrInts = 1,
        padding: IntOrInts | str = 0,
        dilation: IntOrInts = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        batch: int = 1,
    ) -> None:
        super().__init__(batch)
        in_channels = check_int("in_channels", in_channels, minimum=1)
        out_channels = check_int("out_channels", out_channels, minimum=1)
        groups = check_int("groups", groups, minimum=1)
        for name, n in (("in_channels", in_channels), ("out_channels", out_channels)):
            if n % groups:
                raise bad_argument(name, n, f"a multiple of groups={groups}")
        members.check_flag("bias", bias)
        try:
            layer = nn.Conv2d(
                in_channels,
                out_channels,
                kernel_size,  # type: ignore[arg-type]
                stride,  # type: ignore[arg-type]
                padding,  # type: ignore[arg-type]
                dilation,  # type: ignore[arg-type]
                groups,
                bias,
                cast(Any, padding_mode),
            )
        except (ValueError, TypeError, RuntimeError) as e:
            raise ArgumentError(f"BatchConv2d's arguments must make an nn.Conv2d: {e}") from e
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size: tuple[int, ...] = layer.kernel_size
        self.stride: tuple[int, ...] = layer.stride
        self.padding: tuple[int, ...] | str = layer.padding
        self.dilation: tuple[int, ...] = layer.dilation
        self.padding_mode = layer.padding_mode
        self.weight = _stacked(layer.weight, self.batch)
        self.bias = _maybe_stacked(layer.bias, self.batch)
        self.reset_parameters()

    def _layer(self) -> nn.Conv2d:
        return nn.Conv2d(
            self.in_channels,
            self.out_channels,
            self.kernel_size,  # type: ignore[arg-type]
            self.stride,  # type: ignore[arg-type]
            self.padding,  # type: ignore[arg-type]
            self.dilation,  # type: ignore[arg-type]
            self.groups,
            self.bias is not None,
            cast(Any, self.padding_mode),
        )

    def reset_parameters(self) -> None:
        """Draws every member afresh, each as ``nn.Conv2d`` draws one."""
        _redraw(self, self._layer())

    def _pads(self) -> list[int]:
        """The padding as ``F.pad`` takes it (last dimension first), for non-zero modes."""
        if self.padding == "valid":
            return [0, 0, 0, 0]
        if self.padding == "same":
            out = []
            for d, k in zip(reversed(self.dilation), reversed(self.kernel_size), strict=True):
                total = d * (k - 1)
                out += [total // 2, total - total // 2]
            return out
        return [p for p in reversed(cast(tuple[int, ...], self.padding)) for _ in range(2)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Merged rows ``[(B*batch), in, H, W]`` -> ``[(B*batch), out, H', W']``."""
        h = _channels_side_by_side(x, self.batch, self.in_channels, "BatchConv2d", True)
        w = self.weight.reshape(-1, *self.weight.shape[2:])
        bias = None if self.bias is None else self.bias.reshape(-1)
        padding: Any = self.padding
        if self.padding_mode != "zeros":
            h = F.pad(h, self._pads(), mode=self.padding_mode)
            padding = 0
        y = F.conv2d(h, w, bias, self.stride, padding, self.dilation, self.batch * self.groups)
        return y.reshape(-1, self.out_channels, *y.shape[2:])

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}, bias={self.bias is not None}, "
            f"padding_mode={self.padding_mode!r}, batch={self.batch}"
        )


class _ContiguousGrad(torch.autograd.Function):
    """The identity, handing back a contiguous gradient, as a member's own layer receives.

    The gradient of one member's slice of a concatenation is a strided view; torch's batch
    norm kernel reads a strided ``[N, C, 1, 1]`` gradient another way, with other rounding.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class BatchBatchNorm2d(_CopiedLayer):
    """`batch` ``nn.BatchNorm2d`` layers, as one batch norm over ``batch * C`` channels.

    Tensors as ``nn.BatchNorm2d``'s, each ``[batch, ...]``: ``weight``, ``bias``,
    ``running_mean``, ``running_var`` ``[batch, C]``, ``num_batches_tracked`` ``[batch]``.
    As in torch, ``num_batches_tracked`` counts training calls only (torchmb counted every
    call), ``momentum=None`` is the cumulative average (each member by its own count), and
    ``track_running_stats=False`` normalizes with the batch's statistics in eval too.
    Outputs, gradients and statistics equal ``nn.BatchNorm2d``'s per member bit for bit on
    contiguous input (channels-last input: within 1e-6, torch's kernel rounds otherwise); 1x1
    images and members at different counts (``momentum=None``) run one member at a time.

    Args:
        num_features, eps, momentum, affine, track_running_stats: as for
            ``nn.BatchNorm2d``.
        batch: the member count.
    """

    base_class = nn.BatchNorm2d
    weight: nn.Parameter | None
    bias: nn.Parameter | None
    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    num_batches_tracked: torch.Tensor | None

    @staticmethod
    def _arguments(bn: Any) -> tuple[Any, ...]:
        return bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        batch: int = 1,
    ) -> None:
        super().__init__(batch)
        self.num_features = check_int("num_features", num_features, minimum=1)
        self.eps = check_finite("eps", eps, low=0)
        if momentum is not None:
            momentum = check_finite(
                "momentum", momentum, 0, 1, expected="a number in [0, 1], or None"
            )
        self.momentum = momentum
        self.affine = members.check_flag("affine", affine)
        self.track_running_stats = members.check_flag("track_running_stats", track_running_stats)
        layer = nn.BatchNorm2d(num_features, eps, momentum, affine, track_running_stats)
        self.weight = _maybe_stacked(layer.weight, self.batch)
        self.bias = _maybe_stacked(layer.bias, self.batch)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            t = getattr(layer, name)
            self.register_buffer(
                name, None if t is None else t.unsqueeze(0).repeat_interleave(self.batch, 0)
            )

    def reset_running_stats(self) -> None:
        """Every member's running statistics back to torch's start (0, 1, no batches)."""
        if self.running_mean is not None and self.running_var is not None:
            self.running_mean.zero_()
            self.running_var.fill_(1)
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.zero_()

    def _factors(self) -> list[float]:
        """Each member's weight for this batch's statistics in the running ones."""
        counts = self.num_batches_tracked
        if self.momentum is not None or counts is None:
            return [self.momentum or 0.0] * self.batch
        return [1.0 / float(c) for c in counts.tolist()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Merged rows ``[(B*batch), C, H, W]`` normalized, each member by its own layer."""
        h = _channels_side_by_side(x, self.batch, self.num_features, "BatchBatchNorm2d", True)
        tracking = self.training and self.track_running_stats
        if tracking and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        factors = self._factors() if tracking else [0.0] * self.batch
        use_batch = self.training or self.running_mean is None
        keep = not self.training or self.track_running_stats
        # Views: batch_norm updates the running statistics in place, in each member's row.
        mean, var = (
            t.view(-1) if t is not None and keep else None
            for t in (self.running_mean, self.running_var)
        )
        w, b = (None if t is None else t.reshape(-1) for t in (self.weight, self.bias))
        # One call per member's channels where one call cannot do: momentum=None with members
        # at different counts, and 1x1 images, which torch's kernel reads as channels-last,
        # vectorized across the channels: its rounding then depends on their number.
        if len(set(factors)) == 1 and h.shape[2:].numel() != 1:
            return F.batch_norm(h, mean, var, w, b, use_batch, factors[0], self.eps).reshape(
                x.shape
            )
        c = self.num_features

        def rows(t: torch.Tensor | None, g: int) -> torch.Tensor | None:
            return None if t is None else t[g * c : (g + 1) * c]

        parts = [
            _ContiguousGrad.apply(
                F.batch_norm(
                    h[:, g * c : (g + 1) * c].contiguous(),  # the member's layout, the same kernel
                    rows(mean, g),
                    rows(var, g),
                    rows(w, g),
                    rows(b, g),
                    use_batch,
                    factors[g],
                    self.eps,
                )
            )
            for g in range(self.batch)
        ]
        return torch.cat(parts, 1).reshape(x.shape)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, track_running_stats={self.track_running_stats}, "
            f"batch={self.batch}"
        )


class BatchGroupNorm(_CopiedLayer):
    """`batch` ``nn.GroupNorm`` layers, as one group norm over ``batch * num_groups`` groups.

    ``weight`` and ``bias`` are ``[batch, C]``. Inputs are merged rows ``[(B*batch), C, ...]``
    of any rank, as ``nn.GroupNorm`` takes.

    Args:
        num_groups, num_channels, eps, affine: as for ``nn.GroupNorm``.
        batch: the member count.
    """

    base_class = nn.GroupNorm
    weight: nn.Parameter | None
    bias: nn.Parameter | None

    @staticmethod
    def _arguments(gn: Any) -> tuple[Any, ...]:
        return gn.num_groups, gn.num_channels, gn.eps, gn.affine

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        batch: int = 1,
    ) -> None:
        super().__init__(batch)
        self.num_groups = check_int("num_groups", num_groups, minimum=1)
        self.num_channels = check_int("num_channels", num_channels, minimum=1)
        if num_channels % num_groups:
            raise bad_argument(
                "num_channels", num_channels, f"a multiple of num_groups={num_groups}"
            )
        self.eps = check_finite("eps", eps, low=0)
        self.affine = members.check_flag("affine", affine)
        layer = nn.GroupNorm(num_groups, num_channels, eps, affine)
        self.weight = _maybe_stacked(layer.weight, self.batch)
        self.bias = _maybe_stacked(layer.bias, self.batch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Merged rows ``[(B*batch), C, ...]`` normalized, each member by its own layer."""
        h = _channels_side_by_side(x, self.batch, self.num_channels, "BatchGroupNorm", False)
        w = None if self.weight is None else self.weight.reshape(-1)
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.group_norm(h, self.batch * self.num_groups, w, b, self.eps).reshape(x.shape)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"batch={self.batch}"
        )
