"""The checked fast path of the torchmb shim (dualtrain's own; torchmb has no such module).

A module of a registered ``base_class`` (the wrapped module itself, or a child of an
``nn.Sequential``, nested Sequentials included) runs through its registered
`AbstractBatchModule`, called with the members' stacked tensors by
``torch.func.functional_call`` and fed inputs in torchmb's merged ``(b g)`` order.
Every other piece runs the generic way, ``vmap`` over the members.
Before the first use, `verify` runs each registered piece beside the generic path on the
same inputs and weights (outputs, gradients, updated buffers) and refuses one that differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.utils import _pytree as pytree

from dualtrain.batching import isolation
from dualtrain.errors import ArgumentError, RegisteredModuleError
from dualtrain_torch.compat.torchmb.base import AbstractBatchModule
from dualtrain_torch.compat.torchmb.functional import merge_batch, to_members
from dualtrain_torch.compat.torchmb.utils import registered_for

__all__ = ["Piece", "plan", "run_fast", "run_generic", "verify"]

Tensors = dict[str, torch.Tensor]


@dataclasses.dataclass
class Piece:
    """One step of the fast path: a module (a Sequential's child, or the whole module)."""

    name: str  # the child's name in the Sequential; "" for the whole module
    module: nn.Module  # the generic way: the template's module
    custom: AbstractBatchModule | None  # the registered way, when there is one

    def label(self) -> str:
        where = f"child {self.name!r}" if self.name else "the module"
        base = type(self.module).__name__
        return f"{type(self.custom).__name__} (registered for {base}, at {where})"

    def split(self, tensors: Tensors) -> Tensors:
        """This piece's slice of the whole module's stacked tensors, under its own names."""
        if not self.name:
            return tensors
        prefix = self.name + "."
        return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def plan(template: nn.Module, batch: int) -> list[Piece] | None:
    """The fast path's pieces, or None when nothing registered applies."""
    cls = registered_for(template)
    if cls is not None:
        return [_piece("", template, cls, batch)]
    if isinstance(template, nn.Sequential):
        pieces = _flatten(template, "", batch)
        if any(p.custom is not None for p in pieces):
            return pieces
    return None


def _flatten(sequential: nn.Sequential, prefix: str, batch: int) -> list[Piece]:
    """The Sequential's children in order; a nested Sequential's children in its place."""
    out: list[Piece] = []
    for name, child in sequential.named_children():
        cls = registered_for(child)
        if cls is None and isinstance(child, nn.Sequential):
            out += _flatten(child, f"{prefix}{name}.", batch)
        else:
            out.append(_piece(prefix + name, child, cls, batch))
    return out


def _piece(
    name: str, module: nn.Module, cls: type[AbstractBatchModule] | None, batch: int
) -> Piece:
    if cls is None:
        return Piece(name, module, None)
    custom = cls.from_module(module, batch)
    piece = Piece(name, module, cast(AbstractBatchModule, custom))
    if not isinstance(custom, AbstractBatchModule):
        raise RegisteredModuleError(
            f"{cls.__name__}.from_module must return an AbstractBatchModule; got "
            f"{type(custom).__name__}"
        )
    shared = set(custom.shared_buffers)
    own = {n: t for n, t in _tensors(custom).items() if n not in shared}
    base = {n: t for n, t in _tensors(module).items() if n not in shared}
    missing = sorted(set(base) - set(own))
    extra = sorted(set(own) - set(base))
    if missing or extra:
        raise RegisteredModuleError(
            f"the registered batch module {piece.label()} must hold the base module's "
            f"tensors under the same names; it lacks {missing} and has {extra} beyond them"
        )
    for n, t in base.items():
        if tuple(own[n].shape) != (batch, *t.shape):
            raise RegisteredModuleError(
                f"the registered batch module {piece.label()} must hold {n!r} as "
                f"[batch, *shape] = {(batch, *t.shape)}; it holds {tuple(own[n].shape)}"
            )
    return piece


def _tensors(module: nn.Module) -> Tensors:
    return dict(module.named_parameters()) | dict(module.named_buffers())


def run_generic(module: nn.Module, params: Tensors, buffers: Tensors, inputs: Sequence[Any]) -> Any:
    """`module` for every member, ``vmap`` over ``[G, B, ...]`` inputs and stacked tensors."""

    def one(p: Tensors, b: Tensors, *x: Any) -> Any:
        return functional_call(module, (p, b), x)

    dims = tuple(0 if isinstance(x, torch.Tensor) else None for x in inputs)
    return vmap(one, in_dims=(0, 0, *dims), randomness="different")(params, buffers, *inputs)


def _run_custom(
    piece: Piece, params: Tensors, buffers: Tensors, inputs: Sequence[Any], batch: int
) -> Any:
    """The registered module on merged ``(b g)`` inputs, its outputs back as ``[G, B, ...]``."""
    custom = cast(AbstractBatchModule, piece.custom)
    shared = set(custom.shared_buffers)
    swapped = {k: v for k, v in (params | buffers).items() if k not in shared}
    merged = tuple(merge_batch(x) if isinstance(x, torch.Tensor) else x for x in inputs)
    out = functional_call(custom, swapped, merged)
    return pytree.tree_map(
        lambda t: to_members(t, batch, "(b g)") if isinstance(t, torch.Tensor) else t, out
    )


def run_fast(
    pieces: Sequence[Piece],
    batch: int,
    params: Tensors,
    buffers: Tensors,
    inputs: Sequence[Any],
) -> Any:
    """The members' outputs ``[G, B, ...]``, registered pieces by their batch modules."""
    if len(pieces) == 1 and not pieces[0].name:
        return _run_custom(pieces[0], params, buffers, inputs, batch)
    if len(inputs) != 1:
        raise ArgumentError(f"an nn.Sequential takes one input; got {len(inputs)}")
    h: Any = inputs[0]
    for piece in pieces:
        p, b = piece.split(params), piece.split(buffers)
        if piece.custom is None:
            h = run_generic(piece.module, p, b, (h,))
        else:
            h = _run_custom(piece, p, b, (h,), batch)
    return h


@contextlib.contextmanager
def _checking(modules: Sequence[nn.Module], device: torch.device) -> Iterator[None]:
    """Dropout off (the two paths draw differently) and a forked, fixed RNG."""
    drops = [
        m
        for root in modules
        for m in root.modules()
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.training
    ]
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        torch.manual_seed(0)
        for m in drops:
            m.training = False
        try:
            yield
        finally:
            for m in drops:
                m.training = True


def verify(
    pieces: Sequence[Piece],
    batch: int,
    params: Tensors,
    buffers: Tensors,
    inputs: Sequence[Any],
) -> str:
    """Runs each registered piece beside the generic path; raises if any differs.

    Works on copies: the members' tensors and buffers are left as they are.

    Raises:
        RegisteredModuleError: naming the registered class and what differed (outputs,
            the gradient of a parameter or of the input, an updated buffer).
    """
    device = next(iter((params | buffers).values()), torch.zeros(())).device
    modules = [m for p in pieces for m in (p.module, p.custom) if m is not None]
    checked: list[str] = []
    with _checking(modules, device):
        h = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        for piece in pieces:
            p = {k: v.detach().clone() for k, v in piece.split(params).items()}
            b = piece.split(buffers)
            if piece.custom is None:
                h = [run_generic(piece.module, p, {k: v.clone() for k, v in b.items()}, h)]
                continue
            _compare(piece, batch, p, b, h)
            checked.append(type(piece.custom).__name__)
            h = [run_generic(piece.module, p, {k: v.clone() for k, v in b.items()}, h)]
    return f"registered batch modules {checked} checked against the generic path"


def _compare(
    piece: Piece, batch: int, params: Tensors, buffers: Tensors, inputs: Sequence[Any]
) -> None:
    results = []
    for run in ("registered", "generic"):
        p = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in params.items()}
        b = {k: v.clone() for k, v in buffers.items()}
        xs = [
            x.detach().clone().requires_grad_(x.is_floating_point())
            if isinstance(x, torch.Tensor)
            else x
            for x in inputs
        ]
        if run == "registered":
            out = _run_custom(piece, p, b, xs, batch)
        else:
            out = run_generic(piece.module, p, b, xs)
        found = {
            f"outputs[{i}]": t.detach()
            for i, t in enumerate(pytree.tree_leaves(out))
            if isinstance(t, torch.Tensor)
        }
        wrt = {f"the gradient of {k}": v for k, v in p.items() if v.requires_grad}
        wrt |= {
            f"the gradient of inputs[{i}]": x
            for i, x in enumerate(xs)
            if isinstance(x, torch.Tensor) and x.requires_grad
        }
        heads = [
            t
            for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
        ]
        if heads and wrt:
            # An uneven cotangent: a plain sum would hide errors that cancel out.
            total = cast(torch.Tensor, sum((t * _weights(t)).sum() for t in heads))
            grads = torch.autograd.grad(total, list(wrt.values()), allow_unused=True)
            zeros = [torch.zeros_like(v) for v in wrt.values()]
            found |= {
                n: (g if g is not None else z) for n, g, z in zip(wrt, grads, zeros, strict=True)
            }
        found |= {f"the buffer {k}": v for k, v in b.items()}
        results.append(found)
    mine, ref = results
    for name, want in ref.items():
        got = mine.get(name)
        why = _differs(got, want)
        if why:
            raise RegisteredModuleError(
                f"the registered batch module {piece.label()} disagrees with the generic "
                f"torch.func path on the first call: {name} {why}. Its forward takes and "
                f"returns tensors in merged (b g) order (row b * batch + g is sample b of "
                f"member g) and its tensors are [batch, ...]; fix it, or unregister it "
                f"(BATCH_MODULES.pop({type(piece.module).__name__}))"
            )


def _differs(got: torch.Tensor | None, want: torch.Tensor) -> str:
    if got is None:
        return "is missing from its results"
    if tuple(got.shape) != tuple(want.shape):
        return f"has shape {tuple(got.shape)}, not {tuple(want.shape)}"
    if not want.is_floating_point():
        return "" if torch.equal(got, want) else "differs"
    diff = float((got.double() - want.double()).abs().max()) if want.numel() else 0.0
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    # Ten times the isolation probe's rounding allowance: another summation order is fine.
    tol = 10 * isolation.tolerance(str(want.dtype).removeprefix("torch.")) * scale
    return f"differs by {diff:.3g} (tolerance {tol:.3g})" if not diff <= tol else ""


def _weights(t: torch.Tensor) -> torch.Tensor:
    n = t.numel()
    w = torch.cos(torch.arange(n, dtype=torch.float64) * 0.7 + 0.3).reshape(t.shape)
    return w.to(device=t.device, dtype=t.dtype)
