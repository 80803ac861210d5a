"""The "stacked" strategy: each layer runs once over every member's stacked tensors.

``torch.func.vmap`` and ``functional_call`` cost tens of microseconds of Python per layer
and call, which is the whole step for small models (16 MLPs 64-64-4: 2.2 ms a forward and
backward under vmap, about 0.2 ms written by hand). For an ``nn.Sequential`` (nested ones
too) of the layers below, this strategy runs what a user batching by hand writes: a
Linear is one ``baddbmm`` over ``[batch, rows, in]``, a Conv is one grouped convolution
(one dense convolution with ``batch * out`` channels when every member reads the same
input), a pooling or an activation runs once over ``[batch * B, ...]``. Gradients land
in the stacked parameters as they do under vmap.

A model with any other piece (a custom ``forward``, a hook, a BatchNorm, a parametrized
weight) is not planned: the strategy is not offered, and "auto" measures the others. A
planned model is checked against vmap on its first call (outputs and gradients), so a
mistake here costs speed, never a wrong answer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional

__all__ = ["Plan", "global_hooks", "plan", "run", "verify"]

Tensors = dict[str, torch.Tensor]

# Layers that act on each element (or each sample's features) alike, whatever the leading
# dimensions: called as they are on [batch, B, ...] (Dropout draws per element, so members
# draw apart). Exact classes only: a subclass may change forward.
_ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.Identity,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.Hardtanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Softplus,
    nn.Dropout,
)
# Parameter-free layers over [N, C, ...] samples: run on [batch * B, C, ...].
_PER_SAMPLE: tuple[type[nn.Module], ...] = (
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
)
_CONV: dict[type[nn.Module], Any] = {nn.Conv1d: functional.conv1d, nn.Conv2d: functional.conv2d}


@dataclasses.dataclass(frozen=True)
class Step:
    """One layer of the plan: its kind, the module, and its parameters' stacked names."""

    kind: str  # "linear", "conv", "elementwise", "per_sample", "flatten"
    module: nn.Module
    prefix: str  # "0." for the Sequential's first child; names are prefix + "weight"


@dataclasses.dataclass(frozen=True)
class Plan:
    """The layers of a Sequential, in order, as the stacked strategy runs them."""

    steps: tuple[Step, ...]


def _has_hooks(module: nn.Module) -> bool:
    return any(
        getattr(module, name, None)
        for name in (
            "_forward_pre_hooks",
            "_forward_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
        )
    ) or bool(getattr(module, "_backward_pre_hooks", None))


def global_hooks() -> bool:
    """Hooks registered for every module (``register_module_forward_hook``) are skipped here."""
    from torch.nn.modules import module as base

    return any(
        getattr(base, name, None)
        for name in (
            "_global_forward_hooks",
            "_global_forward_pre_hooks",
            "_global_backward_hooks",
            "_global_backward_pre_hooks",
        )
    )


def _step(module: nn.Module, prefix: str, seen: set[int]) -> list[Step] | None:
    cls = type(module)
    if _has_hooks(module) or module._buffers:
        return None
    if module._parameters:
        # A layer used twice shares its weights (tied): its stacked tensors are found under
        # its first name only. Refused; parameter-free layers may repeat.
        if id(module) in seen:
            return None
        seen.add(id(module))
    if cls is nn.Sequential:
        steps: list[Step] = []
        # Sequential.forward runs every entry of _modules, a repeated one each time
        # (named_children would skip the repeat).
        for name, child in module._modules.items():
            if child is None:
                continue
            more = _step(child, f"{prefix}{name}.", seen)
            if more is None:
                return None
            steps += more
        return steps
    if cls is nn.Linear:
        return [Step("linear", module, prefix)]
    if cls in _CONV:
        conv: Any = module
        if conv.padding_mode != "zeros":
            return None
        return [Step("conv", module, prefix)]
    if cls in _ELEMENTWISE:
        return [Step("elementwise", module, prefix)] if not module._parameters else None
    if cls in _PER_SAMPLE:
        return [Step("per_sample", module, prefix)]
    if cls is nn.Flatten:
        return [Step("flatten", module, prefix)]
    return None


def plan(template: nn.Module) -> Plan | None:
    """The stacked strategy's plan for `template`, or None when it has a piece it cannot run."""
    steps = _step(template, "", set())
    if not steps:
        return None
    return Plan(tuple(steps))


def _linear(step: Step, params: Tensors, x: torch.Tensor, shared: bool) -> torch.Tensor:
    weight = params[step.prefix + "weight"]  # [batch, out, in]
    bias = params.get(step.prefix + "bias")  # [batch, out] or absent
    batch, out, inputs = weight.shape
    if shared:  # x [*, in]: one matmul broadcast over the members
        rows = x.reshape(-1, inputs)
        y = torch.matmul(rows, weight.transpose(1, 2))
        if bias is not None:
            y = y + bias.unsqueeze(1)
        return y.reshape(batch, *x.shape[:-1], out)
    rows = x.reshape(batch, -1, inputs)
    if bias is None:
        y = torch.bmm(rows, weight.transpose(1, 2))
    else:
        y = torch.baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2))
    return y.reshape(*x.shape[:-1], out)


def _conv(step: Step, params: Tensors, x: torch.Tensor, shared: bool) -> torch.Tensor:
    module: Any = step.module
    weight = params[step.prefix + "weight"]  # [batch, out, in / groups, *kernel]
    bias = params.get(step.prefix + "bias")
    batch, out = weight.shape[:2]
    conv = _CONV[type(module)]
    flat_weight = weight.reshape(batch * out, *weight.shape[2:])
    flat_bias = None if bias is None else bias.reshape(batch * out)
    options = (module.stride, module.padding, module.dilation)
    if shared and module.groups == 1:  # x [B, C, ...]: one convolution, every member's filters
        y = conv(x, flat_weight, flat_bias, *options, module.groups)
        return y.unflatten(1, (batch, out)).transpose(0, 1)
    if shared:  # grouped filters: each member's groups read their own copy of the input
        x = x.expand(batch, *x.shape)
    # x [batch, B, C, ...] -> [B, batch * C, ...]: member i's channels form group i.
    samples = x.transpose(0, 1).reshape(x.shape[1], -1, *x.shape[3:])
    y = conv(samples, flat_weight, flat_bias, *options, batch * module.groups)
    return y.unflatten(1, (batch, out)).transpose(0, 1)


def _flatten(step: Step, x: torch.Tensor) -> torch.Tensor:
    module: Any = step.module
    # The members' dimension is one more in front: non-negative dims move by one.
    start = module.start_dim + 1 if module.start_dim >= 0 else module.start_dim
    end = module.end_dim + 1 if module.end_dim >= 0 else module.end_dim
    return x.flatten(start, end)


def run(
    layers: Plan, params: Tensors, inputs: Sequence[Any], shared: bool, batch: int
) -> torch.Tensor:
    """The members' outputs ``[batch, B, ...]`` for the Sequential's one input.

    Raises:
        TypeError: not exactly one tensor input (a Sequential takes one).
    """
    if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor):
        raise TypeError("the stacked strategy runs a Sequential: exactly one tensor input")
    x: torch.Tensor = inputs[0]
    for step in layers.steps:
        if step.kind == "linear":
            x = _linear(step, params, x, shared)
            shared = False
        elif step.kind == "conv":
            x = _conv(step, params, x, shared)
            shared = False
        elif step.kind == "elementwise":
            if shared and step.module.training and isinstance(step.module, nn.Dropout):
                x = x.expand(batch, *x.shape)  # each member draws its own mask
                shared = False
            x = step.module(x)
        elif shared:  # parameter-free layers on the shared input: once for every member
            x = step.module(x)
        elif step.kind == "per_sample":
            y = step.module(x.flatten(0, 1))
            x = y.unflatten(0, x.shape[:2])
        else:
            x = _flatten(step, x)
    if shared:  # no layer held parameters per member: every member's output is the same
        x = x.expand(batch, *x.shape)
    return x


def verify(
    compute: Any,
    reference: Any,
    params: Tensors,
) -> str | None:
    """Compares the stacked strategy with vmap on the same call; returns what differs.

    Args:
        compute: runs the stacked strategy, returning its output tensor.
        reference: runs vmap on the same inputs, returning its output tensor.
        params: the stacked parameters gradients are compared for.

    Returns:
        None when outputs and gradients agree (to the dtype's rounding), else a sentence.
    """
    names = [k for k, p in params.items() if p.requires_grad]
    got = compute()
    want = reference()
    if got.shape != want.shape or got.dtype != want.dtype:
        return (
            f"outputs of shape {tuple(got.shape)} and {got.dtype}, "
            f"vmap's of shape {tuple(want.shape)} and {want.dtype}"
        )
    tolerance = _tolerance(got.dtype)
    gap = _relative_gap(got, want)
    if not gap <= tolerance:  # a NaN gap is a difference, never agreement
        return f"outputs differ from vmap's by {gap:.3g} of their norm"
    if not names or not got.requires_grad:
        return None
    # One random cotangent: a gradient mistake that sums to zero against ones would hide.
    weight = torch.randn_like(want)
    targets = [params[k] for k in names]
    ours = torch.autograd.grad((got * weight).sum(), targets, allow_unused=True)
    theirs = torch.autograd.grad((want * weight).sum(), targets, allow_unused=True)
    for name, a, b in zip(names, ours, theirs, strict=True):
        if (a is None) != (b is None):
            return f"the gradient of {name} is missing on one side"
        if a is not None and b is not None:
            gap = _relative_gap(a, b)
            if not gap <= tolerance:
                return f"the gradient of {name} differs from vmap's by {gap:.3g} of its norm"
    return None


def _relative_gap(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` in the 2-norm, each member's rows apart (the worst).

    Non-finite values must sit at the same places with the same values (else the gap is
    infinite); the norms are taken over the finite ones.
    """
    got, want = got.detach().double().flatten(1), want.detach().double().flatten(1)
    finite = torch.isfinite(want)
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    if not bool(torch.equal(torch.isfinite(got), finite)) or not bool(same[~finite].all()):
        return math.inf
    got, want = got.where(finite, 0.0), want.where(finite, 0.0)
    scale = torch.linalg.vector_norm(want, dim=1).clamp_min(1e-30)
    return float((torch.linalg.vector_norm(got - want, dim=1) / scale).max())


def _tolerance(dtype: torch.dtype) -> float:
    """How far apart, relative to the norm, two orders of the same float sums may land."""
    if dtype == torch.float64:
        return 1e-9
    if dtype == torch.float32:
        return 1e-3
    return 3e-2
