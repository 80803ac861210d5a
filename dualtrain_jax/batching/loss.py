"""Per-member losses and top-k accuracies of a batched model's outputs (JAX)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dualtrain.batching import members
from dualtrain.errors import bad_argument

__all__ = ["batch_loss", "batch_topk", "cross_entropy"]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-sample softmax cross-entropy with integer labels, classes on axis 1.

    As torch's ``F.cross_entropy(..., reduction="none")``; optax puts classes last.
    """
    logp = jax.nn.log_softmax(logits, axis=1)
    picked = jnp.take_along_axis(logp, jnp.expand_dims(labels, 1).astype(jnp.int32), axis=1)
    return -jnp.squeeze(picked, 1)


def _outputs(outputs: Any, expected: str) -> jax.Array:
    """`outputs` as an array; a dict or tuple (a pytree output) is refused, naming it."""
    if not hasattr(outputs, "shape"):
        raise bad_argument(
            "outputs",
            type(outputs).__name__,
            f"one array {expected} (for pytree outputs, call it on each leaf)",
        )
    return jnp.asarray(outputs)


def _targets(outputs: jax.Array, targets: Any, batch: int) -> tuple[jax.Array, bool]:
    """The targets and whether every member shares them (``[B, ...]``, not ``[batch, B]``)."""
    targets = jnp.asarray(targets)
    return targets, members.shared_targets(outputs.shape, targets.shape, batch)


def batch_loss(
    outputs: jax.Array,
    targets: Any,
    batch: int,
    loss_fn: Callable[..., jax.Array] | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Each member's loss: ``loss_fn(outputs[i], targets[i])`` reduced per member.

    Args:
        outputs: ``[batch, B, ...]``.
        targets: ``[batch, B, ...]``, or ``[B, ...]`` shared by every member.
        batch: the member count (checked against the leading dimension).
        loss_fn: per-sample (or per-element) losses, JAX style: ``loss_fn(outputs,
            targets) -> [B, ...]``; None means `cross_entropy`, torch's default.
        reduction: ``"mean"`` or ``"sum"`` over each member's losses give ``[batch]``;
            ``"none"`` gives them as they are, ``[batch, B, ...]``.

    Returns:
        ``[batch]`` (or ``[batch, B, ...]``); the gradient of ``.sum()`` gives every member
        the gradient of its own loss.
    """
    batch = members.check_batch(batch)
    reduction = members.check_reduction(reduction)
    outputs = _outputs(outputs, "[batch, B, ...]")
    members.check_leading("outputs", outputs.shape, batch, "[batch, B, ...]")
    targets, shared = _targets(outputs, targets, batch)

    fn = cross_entropy if loss_fn is None else loss_fn

    def one(o: jax.Array, t: jax.Array) -> jax.Array:
        losses = fn(o, t)
        if reduction == "none":
            return losses
        return jnp.mean(losses) if reduction == "mean" else jnp.sum(losses)

    return jax.vmap(one, in_axes=(0, None if shared else 0))(outputs, targets)


def batch_topk(outputs: jax.Array, targets: Any, batch: int, ks: Any = (1, 5)) -> jax.Array:
    """Each member's top-k accuracy for each k: ``[len(ks), batch]`` fractions in [0, 1].

    Args:
        outputs: scores ``[batch, B, classes]``.
        targets: class ids ``[batch, B]``, or ``[B]`` shared by every member.
        batch: the member count.
        ks: the k of each row; a k above the number of classes counts as every class.
    """
    batch = members.check_batch(batch)
    ks = members.check_ks(ks)
    outputs = _outputs(outputs, "[batch, B, classes]")
    members.check_scores(outputs.shape, batch)
    targets, shared = _targets(outputs, targets, batch)
    members.check_class_ids(targets.shape, shared)
    classes = outputs.shape[-1]
    top = jax.lax.top_k(outputs, min(max(ks), classes))[1]
    full = jnp.broadcast_to(targets, outputs.shape[:2])
    hits = top == full[..., None]
    dtype = outputs.dtype if jnp.issubdtype(outputs.dtype, jnp.floating) else jnp.float32
    rows = [jnp.any(hits[..., : min(k, classes)], -1).astype(dtype).mean(-1) for k in ks]
    return jnp.stack(rows)
