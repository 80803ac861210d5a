"""The demo's training loop in JAX: the same MLP, data and SGD as `dualtrain_torch.demo`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualtrain import convert

__all__ = ["train_mlp"]


def train_mlp(
    params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, *, lr: float, steps: int
) -> list[float]:
    """The demo's training loop; the contract is `dualtrain.demo.TRAIN_MLP_CONTRACT`."""
    weights = convert(params, to="jax")
    inputs, labels = convert((x, y), to="jax")
    optimizer = optax.sgd(lr)

    def loss_fn(w: dict[str, Any]) -> jax.Array:
        hidden = jnp.tanh(inputs @ w["w1"] + w["b1"])
        logits = hidden @ w["w2"] + w["b2"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @jax.jit
    def step(w: dict[str, Any], state: Any) -> tuple[dict[str, Any], Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(w)
        updates, state = optimizer.update(grads, state, w)
        return optax.apply_updates(w, updates), state, loss

    state = optimizer.init(weights)
    losses = []
    for _ in range(steps):
        weights, state, loss = step(weights, state)
        losses.append(float(loss))
    return losses
