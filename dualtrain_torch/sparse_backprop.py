"""Top-k sparsified backprop (meProp) for ``nn.Linear`` layers: opt-in and approximate.

`patch_linears` turns every ``nn.Linear`` of a module, in place, into a `TopKLinear` by
swapping its class, so the object stays what it was: ``isinstance(m, nn.Linear)``, the same
``Parameter`` objects, ``state_dict`` keys, hooks, ``.to()``, pickling and ``deepcopy``.
The forward pass is exact; the backward keeps each row's k largest output gradients (see
`dualtrain.accelerate.topk` for the maths). A layer whose k reaches its ``out_features``
runs ``F.linear`` itself: its gradients are exactly the dense ones.

The sparsified gradient is applied with dense matmuls on a zeroed copy: honest about what is
computed, any input rank, any floating dtype. (nebulgym's COO sparse matmuls were not faster
on CPU, and crashed on 3-D inputs.)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from dualtrain.accelerate.topk import Approximation, resolve_k
from dualtrain.errors import bad_argument

__all__ = [
    "approximations",
    "TopKLinear",
    "keep_topk",
    "patch_linears",
    "topk_linear",
    "unpatch_linears",
]


def keep_topk(grad: torch.Tensor, k: int) -> torch.Tensor:
    """`grad` with all but each row's k largest ``|grad|`` (over the last axis) zeroed."""
    if k >= grad.shape[-1]:
        return grad
    index = grad.abs().topk(k, dim=-1, sorted=False).indices
    return torch.zeros_like(grad).scatter_(-1, index, grad.gather(-1, index))


class TopKLinearFunction(torch.autograd.Function):
    """``F.linear`` forward; backward through the top-k of the output gradient."""

    @staticmethod
    def forward(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, k: int
    ) -> torch.Tensor:
        return F.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, weight, _, k = inputs
        ctx.save_for_backward(x, weight)
        ctx.k = k

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        out_features, in_features = weight.shape
        kept = keep_topk(grad, ctx.k)
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        grad_x = kept @ weight if need_x else None
        grad_w = kept.reshape(-1, out_features).T @ x.reshape(-1, in_features) if need_w else None
        # The bias gradient stays dense, as in the meProp paper: it is free.
        grad_b = grad.reshape(-1, out_features).sum(0) if need_b else None
        return grad_x, grad_w, grad_b, None


def topk_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, k: int
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` whose backward keeps each row's k largest gradients.

    Args:
        x: input ``[..., in]``, any rank >= 1.
        weight: ``(out, in)``.
        bias: ``(out,)`` or None.
        k: an int >= 1; ``k >= out`` is plain ``F.linear`` (exact gradients).

    Raises:
        ArgumentError: `k` is not an int >= 1.
    """
    k = resolve_k(weight.shape[0], k=k)
    if k >= weight.shape[0]:
        return F.linear(x, weight, bias)
    out: torch.Tensor = TopKLinearFunction.apply(x, weight, bias, k)
    return out


class TopKLinear(nn.Linear):
    """An ``nn.Linear`` whose backward keeps each row's `topk_k` largest output gradients.

    Made only by `patch_linears` swapping an ``nn.Linear``'s class (module-level, so pickle
    and deepcopy find it); `unpatch_linears` swaps it back.

    Attributes:
        topk_k: output gradients kept per row; ``>= out_features`` means exact.
    """

    topk_k: int

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.topk_k >= self.out_features:
            return F.linear(input, self.weight, self.bias)
        out: torch.Tensor = TopKLinearFunction.apply(input, self.weight, self.bias, self.topk_k)
        return out

    def extra_repr(self) -> str:
        mode = "exact" if self.topk_k >= self.out_features else "approximate backprop"
        return f"{super().extra_repr()}, topk_k={self.topk_k} ({mode})"


def _linears(module: nn.Module) -> list[tuple[str, nn.Linear]]:
    # Exactly nn.Linear (or one already patched): a subclass may override forward, or never
    # call it (MultiheadAttention's out_proj), so swapping its class would change or misreport
    # what runs.
    return [(name, m) for name, m in module.named_modules() if type(m) in (nn.Linear, TopKLinear)]


def patch_linears(
    module: nn.Module, *, k: int | None = None, ratio: float | None = None
) -> list[Approximation]:
    """Gives every ``nn.Linear`` in `module` (itself included) top-k backprop, in place.

    Only modules whose type is exactly ``nn.Linear`` are patched (subclasses are left
    alone). Patching again updates k. Each layer's k comes from `resolve_k` with its
    ``out_features``: a given `k` for all, else ``max(1, round(ratio * out_features))``.

    Args:
        module: any ``nn.Module``.
        k: output gradients kept per row, an int >= 1 (exclusive with `ratio`).
        ratio: fraction of each layer's outputs kept, in (0, 1]; default 0.04.

    Returns:
        One `Approximation` per patched layer, in ``named_modules`` order; those with
        ``dense`` True compute exact gradients.

    Raises:
        ArgumentError: `module` is not an ``nn.Module``, or a bad `k`/`ratio` (nothing is
            patched then).
    """
    if not isinstance(module, nn.Module):
        raise bad_argument("module", module, "a torch.nn.Module")
    resolve_k(1, k=k, ratio=ratio)  # validate before touching anything, even with no Linear
    plan = [(name, m, resolve_k(m.out_features, k=k, ratio=ratio)) for name, m in _linears(module)]
    for _, m, kept in plan:
        m.__class__ = TopKLinear
        m.topk_k = kept  # type: ignore[assignment]  # the class was swapped just above
    return [Approximation(name, m.out_features, kept) for name, m, kept in plan]


def approximations(module: nn.Module) -> list[Approximation]:
    """What `module` approximates now: one record per `TopKLinear` in it (none: exact).

    Read from the layers, not from how they were patched: a model patched before it was
    accelerated reports its approximations too.
    """
    return [
        Approximation(name, m.out_features, m.topk_k)
        for name, m in module.named_modules()
        if isinstance(m, TopKLinear)
    ]


def unpatch_linears(module: nn.Module) -> int:
    """Restores every `TopKLinear` in `module` to a plain ``nn.Linear``; returns how many."""
    if not isinstance(module, nn.Module):
        raise bad_argument("module", module, "a torch.nn.Module")
    count = 0
    for _, m in module.named_modules():
        if type(m) is TopKLinear:
            m.__class__ = nn.Linear  # type: ignore[assignment]  # undoes patch_linears' swap
            m.__dict__.pop("topk_k", None)
            count += 1
    return count
