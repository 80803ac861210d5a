"""The demo's training loop in torch: the same MLP, data and SGD as `dualtrain_jax.demo`."""

from __future__ import annotations

import numpy as np
import torch

from dualtrain import convert

__all__ = ["train_mlp"]


def train_mlp(
    params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, *, lr: float, steps: int
) -> list[float]:
    """The demo's training loop; the contract is `dualtrain.demo.TRAIN_MLP_CONTRACT`."""
    # copy=True: the parameters become ordinary leaf tensors that SGD updates in place.
    weights = {k: v.requires_grad_() for k, v in convert(params, to="torch", copy=True).items()}
    inputs, labels = convert((x, y), to="torch")
    optimizer = torch.optim.SGD(weights.values(), lr=lr)
    losses = []
    for _ in range(steps):
        hidden = torch.tanh(inputs @ weights["w1"] + weights["b1"])
        logits = hidden @ weights["w2"] + weights["b2"]
        loss = torch.nn.functional.cross_entropy(logits, labels.long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
