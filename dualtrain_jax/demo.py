"""The demo's training loop in JAX: `dualtrain.demo.TRAIN_CONTRACT` says what it computes."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax

from dualtrain import Craft, convert
from dualtrain_jax.craft import realize

__all__ = ["train", "train_from_tank"]


def train(
    craft: Craft, x: np.ndarray, y: np.ndarray, *, lr: float, steps: int, seed: int
) -> tuple[list[float], Any]:
    """The demo's training loop; the contract is `dualtrain.demo.TRAIN_CONTRACT`."""
    module = realize(craft, seed=seed)
    inputs, labels = convert((x, y), to="jax")
    optimizer = optax.sgd(lr)

    def loss_fn(params: Any, state: Any) -> tuple[jax.Array, Any]:
        logits, state = module.apply(params, state, inputs, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), state

    @jax.jit
    def step(params: Any, state: Any, opt_state: Any) -> tuple[Any, Any, Any, jax.Array]:
        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    params, state, opt_state = module.params, module.state, optimizer.init(module.params)
    losses = []
    for _ in range(steps):
        params, state, opt_state, loss = step(params, state, opt_state)
        losses.append(float(loss))
    module.params, module.state = params, state
    return losses, module


def train_from_tank(craft: Craft, tank: Any, *, lr: float, steps: int, seed: int) -> list[float]:
    """`steps` SGD steps on Tank batches (``to="jax"``): images scaled to [0, 1]."""
    module = realize(craft, seed=seed)
    optimizer = optax.sgd(lr)

    @jax.jit
    def step(params: Any, state: Any, opt_state: Any, images: Any, labels: Any) -> Any:
        def loss_fn(params: Any) -> tuple[jax.Array, Any]:
            x = images.reshape(images.shape[0], -1).astype("float32") / 255
            logits, new_state = module.apply(params, state, x, train=True)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, new_state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    params, state, opt_state = module.params, module.state, optimizer.init(module.params)
    losses = []
    for _ in range(steps):
        batch = tank.next()
        params, state, opt_state, loss = step(
            params, state, opt_state, batch["image"], batch["label"]
        )
        losses.append(float(loss))
    return losses
