"""torchmb's layout helpers, `batch_loss` and `batch_accuracy` (``torchmb.functional``).

torchmb flattens ``[G, B, ...]`` into ``(b g)`` order (sample-major, member-minor); these
helpers do the same with plain reshapes. The data orders are torchmb's: ``'g b'`` and
``'b g'`` (two leading dimensions), ``'(g b)'`` and ``'(b g)'`` (already flattened; torchmb
lists them but fails on them, here they work).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from dualtrain.batching import members
from dualtrain.errors import ShapeError, bad_argument
from dualtrain_torch.batching.loss import batch_loss as _batch_loss, batch_topk as _batch_topk

__all__ = [
    "DATA_ORDERS",
    "batch_accuracy",
    "check_order",
    "from_members",
    "batch_loss",
    "batch_topk",
    "inner_batch_size",
    "merge_batch",
    "split_batch",
    "to_members",
]

DATA_ORDERS = ("g b", "b g", "(g b)", "(b g)")


def check_order(data_order: object) -> str:
    """`data_order` if it is one of `DATA_ORDERS`.

    Raises:
        ArgumentError: it is not.
    """
    if not isinstance(data_order, str) or data_order not in DATA_ORDERS:
        raise bad_argument("data_order", data_order, f"one of {DATA_ORDERS}")
    return data_order


def inner_batch_size(x: torch.Tensor, batch: int) -> int:
    """B, the samples per member, of a merged ``[(b g), ...]`` tensor.

    Raises:
        ShapeError: the leading dimension is not a multiple of `batch`.
    """
    batch = members.check_batch(batch)
    if x.ndim == 0 or x.shape[0] % batch:
        raise ShapeError(
            f"a merged input must have a multiple of batch={batch} rows, [(B*batch), ...]; "
            f"got shape {tuple(x.shape)}"
        )
    return x.shape[0] // batch


def to_members(x: torch.Tensor, batch: int, data_order: str = "g b") -> torch.Tensor:
    """`x` in `data_order` as ``[G, B, ...]`` (a view where the order allows)."""
    order = check_order(data_order)
    if order in ("g b", "b g"):
        if x.ndim < 2 or x.shape[0 if order == "g b" else 1] != batch:
            raise ShapeError(
                f"inputs in data_order {order!r} must be "
                f"{'[G, B, ...]' if order == 'g b' else '[B, G, ...]'} with G=batch={batch}; "
                f"got shape {tuple(x.shape)}"
            )
        return x if order == "g b" else x.transpose(0, 1)
    b = inner_batch_size(x, batch)
    if order == "(g b)":
        return x.reshape(batch, b, *x.shape[1:])
    return x.reshape(b, batch, *x.shape[1:]).transpose(0, 1)


def from_members(x: torch.Tensor, data_order: str = "g b") -> torch.Tensor:
    """``[G, B, ...]`` in `data_order` (the inverse of `to_members`)."""
    order = check_order(data_order)
    if order == "g b":
        return x
    if order == "b g":
        return x.transpose(0, 1)
    if order == "(g b)":
        return x.reshape(-1, *x.shape[2:])
    return x.transpose(0, 1).reshape(-1, *x.shape[2:])


def merge_batch(x: torch.Tensor, data_order: str = "g b") -> torch.Tensor:
    """``[G, B, ...]`` (or ``[B, G, ...]``) -> ``[(b g), ...]``, torchmb's merged order."""
    order = check_order(data_order)
    if order in ("(g b)", "(b g)"):
        raise bad_argument("data_order", order, "'g b' or 'b g' (the batch size is unknown)")
    if x.ndim < 2:
        raise ShapeError(f"merge_batch needs [G, B, ...]; got shape {tuple(x.shape)}")
    return (x.transpose(0, 1) if order == "g b" else x).reshape(-1, *x.shape[2:])


def split_batch(x: torch.Tensor, batch: int, data_order: str = "g b") -> torch.Tensor:
    """``[(b g), ...]`` -> ``[G, B, ...]`` (or ``[B, G, ...]``), the inverse of `merge_batch`."""
    return from_members(to_members(x, batch, "(b g)"), data_order)


def batch_loss(
    batch_inputs: torch.Tensor,
    batch_targets: torch.Tensor,
    batch: int | None = None,
    loss_func: Callable[..., torch.Tensor] = F.cross_entropy,
    reduction: str = "mean",
    **kwargs: Any,
) -> torch.Tensor:
    """Torchmb's per-member loss: ``[G, ...]`` (``"mean"``, ``"sum"``) or ``[G, B, ...]``.

    ``loss_func(outputs, targets, **kwargs, reduction="none")`` is taken per sample and
    reduced over the samples' axis B only, as torchmb's: a per-sample loss ``[G, B]``
    gives ``[G]``, a per-pixel one ``[G, B, H, W]`` gives ``[G, H, W]`` (torchmb's mean of
    per-sample losses, so class weights are not renormalized as torch's own ``"mean"`` is).

    Args:
        batch_inputs: the members' outputs ``[G, B, ...]``.
        batch_targets: ``[G, B, ...]`` or ``[B, ...]`` shared by every member.
        batch: G; None reads it from ``batch_inputs``.
        loss_func: a torch loss taking ``reduction=``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        **kwargs: passed to `loss_func` (``weight=``, ``ignore_index=``, ...).
    """
    reduction = members.check_reduction(reduction)
    if batch is None:
        if not isinstance(batch_inputs, torch.Tensor) or batch_inputs.ndim == 0:
            raise bad_argument("batch_inputs", batch_inputs, "a [G, B, ...] tensor")
        batch = int(batch_inputs.shape[0])

    def per_sample(o: torch.Tensor, t: torch.Tensor, reduction: str) -> torch.Tensor:
        return loss_func(o, t, **kwargs, reduction=reduction)

    loss = _batch_loss(batch_inputs, batch_targets, batch, per_sample, "none")
    if reduction == "none":
        return loss
    return loss.mean(1) if reduction == "mean" else loss.sum(1)


def batch_accuracy(
    batch_inputs: torch.Tensor,
    batch_targets: torch.Tensor,
    batch: int,
    k: Sequence[int] | int = (1,),
    count: bool = False,
) -> torch.Tensor:
    """Torchmb's top-k accuracies ``[len(k), G]``: fractions, or hit counts with `count`.

    Args:
        batch_inputs: scores ``[G, B, classes]``.
        batch_targets: class ids ``[G, B]`` or ``[B]`` shared by every member.
        batch: G.
        k: the k of each row (README: ``(1, 5)`` gives top-1 and top-5 rows).
        count: int64 counts of hits instead of fractions.
    """
    fractions = _batch_topk(batch_inputs, batch_targets, batch, ks=k)
    if not members.check_flag("count", count):
        return fractions
    return (fractions.double() * batch_inputs.shape[1]).round().to(torch.int64)


batch_topk = batch_accuracy  # the README's name for it (torchmb renamed it)
