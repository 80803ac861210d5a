"""The isolation probe under torch: does perturbing one member move another?

Split from `batching.run` (the strategies); the neutral verdict is in
`dualtrain.batching.isolation`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.func import functional_call
from torch.utils import _pytree as pytree

from dualtrain.batching import isolation
from dualtrain_torch.batching.run import (
    Run,
    Tensors,
    fixed_rng,
    float_leaves,
    member_inputs,
    member_rows,
)

__all__ = ["probe"]


def probe(run: Run) -> str:
    """Checks on members 0 and 1 that neither moves the other, forward and backward.

    Raises:
        IsolationError: naming the strategy, what moved and the module that mixed them.
    """
    strategy, shared, params = run.strategy, run.shared, run.params
    batch = next(iter(params.values())).shape[0]
    if batch < 2:
        return "skipped (one member)"
    two = slice(0, 2)
    p0 = {k: v[two].detach().clone() for k, v in params.items()}
    b0 = {k: v[two].clone() for k, v in run.buffers.items()}
    x0 = list(member_inputs(run.inputs, two, shared))
    if strategy == "chunked":
        run = dataclasses.replace(run, chunk=1)
    base = _probe_once(run, p0, b0, x0)
    device = next(iter(params.values())).device
    gen = torch.Generator().manual_seed(7)
    for member in (0, 1):
        p1 = {k: _nudge(v, member, 0.05, gen, device) for k, v in p0.items()}
        x1 = x0 if shared else [_nudge(x, member, 0.5, gen, device) for x in x0]
        changed = _probe_once(run, p1, b0, x1)
        found = isolation.leaks(base, changed, member)
        if found:
            culprit = _locate(run.template, (p0, x0), (p1, x1), b0, shared, 1 - member)
            raise isolation.isolation_error(strategy, member, found, culprit)
    return f"passed ({strategy}; members 0 and 1, forward and backward)"


def _nudge(t: Any, member: int, scale: float, gen: torch.Generator, device: Any) -> Any:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return t  # integer inputs (ids) and non-tensors stay as they are
    out = t.detach().clone()
    noise = torch.randn(out[member].shape, generator=gen, dtype=torch.float64)
    out[member] += (scale * noise).to(device=device, dtype=out.dtype)
    return out


def _probe_once(run: Run, p: Tensors, b: Tensors, x: Sequence[Any]) -> dict[str, Any]:
    device = next(iter(p.values())).device
    with fixed_rng(device), torch.enable_grad():
        params = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in p.items()}
        buffers = {k: v.clone() for k, v in b.items()}
        xs = [
            t.clone().requires_grad_(not run.shared)
            if isinstance(t, torch.Tensor) and t.is_floating_point()
            else t
            for t in x
        ]
        out = run.on(params, buffers, xs)
        found: dict[str, Any] = {}
        leaves = pytree.tree_leaves(out)
        for i, t in enumerate(leaves):
            if isinstance(t, torch.Tensor):
                found[f"outputs[{i}]"] = t.detach()
        wrt = {f"the gradient of {k}": v for k, v in params.items() if v.requires_grad}
        wrt.update({f"the gradient of inputs[{i}]": t for i, t in enumerate(xs) if _grad_leaf(t)})
        heads = float_leaves(out)
        if heads and wrt:
            # A fixed, uneven cotangent: a plain sum would hide a leak that cancels out.
            total = cast(torch.Tensor, sum((t * _weights(t)).sum() for t in heads))
            grads = torch.autograd.grad(total, list(wrt.values()), allow_unused=True)
            found.update({n: g for n, g in zip(wrt, grads, strict=True) if g is not None})
        for k, v in buffers.items():
            found[f"the state {k}"] = v
    return {k: v.detach().cpu().double().numpy() for k, v in found.items()}


def _grad_leaf(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


def _weights(t: torch.Tensor) -> torch.Tensor:
    n = t[0].numel()
    w = torch.cos(torch.arange(n, dtype=torch.float64) * 0.7 + 0.3).reshape(t[0].shape)
    return w.to(device=t.device, dtype=t.dtype)


def _locate(
    template: nn.Module,
    base: tuple[Tensors, Sequence[Any]],
    changed: tuple[Tensors, Sequence[Any]],
    buffers: Tensors,
    shared: bool,
    other: int,
) -> str | None:
    """The module that mixed the members, found by running them as a loop with hooks.

    It is the first module, in call order, whose inputs for member `other` are the same in
    both runs but whose outputs are not.
    """
    calls = [_record(template, p, buffers, x, shared, other) for p, x in (base, changed)]
    if len(calls[0]) != len(calls[1]):
        return None
    names = {id(m): n for n, m in template.named_modules()}
    for (mod, ins_a, outs_a), (_, ins_b, outs_b) in zip(calls[0], calls[1], strict=True):
        if _same(ins_a, ins_b) and not _same(outs_a, outs_b):
            name = names.get(id(mod), "?")
            if name == "":
                return f"the forward of {type(mod).__name__} itself (the top module)"
            return f"module {name!r} ({type(mod).__name__})"
    return None


def _record(
    template: nn.Module, p: Tensors, b: Tensors, x: Sequence[Any], shared: bool, other: int
) -> list[tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]]]:
    log: list[tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]]] = []
    current = [-1]

    def hook(mod: nn.Module, args: Any, out: Any) -> None:
        if current[0] == other:
            log.append((mod, _copies(args), _copies(out)))

    handles = [m.register_forward_hook(hook) for m in template.modules()]
    try:
        with fixed_rng(next(iter(p.values())).device), torch.no_grad():
            copies = {k: v.clone() for k, v in b.items()}
            for i in range(next(iter(p.values())).shape[0]):
                current[0] = i
                functional_call(
                    template,
                    (member_rows(p, i), member_rows(copies, i)),
                    member_inputs(x, i, shared),
                )
    finally:
        for h in handles:
            h.remove()
    return log


def _copies(tree: Any) -> list[torch.Tensor]:
    return [t.detach().clone() for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    if len(a) != len(b):
        return False
    for s, t in zip(a, b, strict=True):
        if s.shape != t.shape:
            return False
        if s.is_floating_point():
            tol = isolation.tolerance(str(s.dtype).removeprefix("torch."))
            scale = max(1.0, float(s.abs().max())) if s.numel() else 1.0
            if s.numel() and float((s - t).abs().max()) > tol * scale:
                return False
        elif not torch.equal(s, t):
            return False
    return True
