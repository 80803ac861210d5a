"""The framework-free steps of the adapters' demo loops: what both report, computed once."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["learner_losses", "held_out_accuracy"]


def learner_losses(learner: Any, tank: Any, steps: int) -> list[float]:
    """`steps` steps of a Multiverse `learner` on `tank`'s next batches: each step's loss."""
    losses = []
    for _ in range(steps):
        batch = tank.next()
        losses.append(float(learner.step(batch["image"], batch["label"])))
    return losses


def held_out_accuracy(logits: np.ndarray, labels: np.ndarray, dash: Any, epoch: int) -> float:
    """The share of rows whose top logit is their label, gauged on `dash` as `epoch`'s test."""
    accuracy = float((logits.argmax(1) == labels).mean())
    dash.gauge({"accuracy": accuracy}, 1, epoch, 1, "test")
    return accuracy
