"""Per-member losses and top-k accuracies of a batched model's outputs (torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch.func import vmap

from dualtrain.batching import members

__all__ = ["batch_loss", "batch_topk"]


def _targets(outputs: torch.Tensor, targets: Any, batch: int) -> tuple[torch.Tensor, bool]:
    """The targets and whether every member shares them (``[B, ...]``, not ``[batch, B]``)."""
    if not isinstance(targets, torch.Tensor):
        targets = torch.as_tensor(targets, device=outputs.device)
    return targets, members.shared_targets(outputs.shape, targets.shape, batch)


def batch_loss(
    outputs: torch.Tensor,
    targets: Any,
    batch: int,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Each member's loss: ``loss_fn(outputs[i], targets[i], reduction=reduction)``.

    Args:
        outputs: ``[batch, B, ...]``.
        targets: ``[batch, B, ...]``, or ``[B, ...]`` shared by every member.
        batch: the member count (checked against the leading dimension).
        loss_fn: a torch loss taking ``reduction=`` (``F.mse_loss``, ...); None means
            ``F.cross_entropy``.
        reduction: ``"mean"`` or ``"sum"`` give ``[batch]``; ``"none"`` gives the
            per-sample losses ``[batch, B, ...]``. Weights and ``ignore_index`` keep
            torch's meaning per member: the call is vmapped, not flattened.

    Returns:
        ``[batch]`` (or ``[batch, B, ...]``); ``.sum().backward()`` gives every member the
        gradient of its own loss.
    """
    batch = members.check_batch(batch)
    reduction = members.check_reduction(reduction)
    members.check_leading("outputs", outputs.shape, batch, "[batch, B, ...]")
    targets, shared = _targets(outputs, targets, batch)

    if loss_fn is None and _flat_cross_entropy(outputs, targets, shared):
        return _cross_entropy(outputs, targets, batch, reduction)
    fn = F.cross_entropy if loss_fn is None else loss_fn

    def one(o: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return fn(o, t, reduction=reduction)

    return vmap(one, in_dims=(0, None if shared else 0))(outputs, targets)


def _flat_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor, shared: bool) -> bool:
    """Whether the default loss may run as one flat call over every member.

    Scores ``[batch, B, classes]`` and class ids only: for small models vmap cost more
    than the loss itself.
    """
    want = 1 if shared else 2
    return (
        outputs.ndim == 3
        and outputs.shape[1] > 0  # no rows: each member's mean is torch's nan, per member
        and outputs.shape[2] > 0
        and outputs.is_floating_point()
        # the ids F.cross_entropy takes itself; others (int32) keep vmap's handling of them
        and targets.dtype in (torch.int64, torch.uint8)
        and targets.ndim == want
        and targets.shape[-1] == outputs.shape[1]
    )


def _cross_entropy(
    outputs: torch.Tensor, targets: torch.Tensor, batch: int, reduction: str
) -> torch.Tensor:
    """``F.cross_entropy`` per member from one call over every member's samples.

    A "mean" divides by each member's count of targets that are not ``ignore_index``
    (-100), as torch's mean does.
    """
    rows = outputs.shape[1]
    ids = targets.expand(batch, rows) if targets.ndim == 1 else targets
    losses = F.cross_entropy(
        outputs.reshape(batch * rows, -1), ids.reshape(-1), reduction="none"
    ).view(batch, rows)
    if reduction == "none":
        return losses
    total = losses.sum(1)
    if reduction == "sum":
        return total
    return total / (ids != -100).sum(1).to(total.dtype)


def batch_topk(outputs: torch.Tensor, targets: Any, batch: int, ks: Any = (1, 5)) -> torch.Tensor:
    """Each member's top-k accuracy for each k: ``[len(ks), batch]`` fractions in [0, 1].

    Args:
        outputs: scores ``[batch, B, classes]``.
        targets: class ids ``[batch, B]``, or ``[B]`` shared by every member.
        batch: the member count.
        ks: the k of each row; a k above the number of classes counts as every class.
    """
    batch = members.check_batch(batch)
    ks = members.check_ks(ks)
    members.check_scores(outputs.shape, batch)
    targets, shared = _targets(outputs, targets, batch)
    members.check_class_ids(targets.shape, shared)
    top = outputs.topk(min(max(ks), outputs.shape[-1]), dim=-1).indices
    hits = top == (targets if not shared else targets.expand(batch, -1)).unsqueeze(-1)
    dtype = outputs.dtype if outputs.is_floating_point() else torch.get_default_dtype()
    rows = [hits[..., : min(k, outputs.shape[-1])].any(-1).to(dtype).mean(-1) for k in ks]
    return torch.stack(rows)
