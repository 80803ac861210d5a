"""The demo's training loop in JAX: `dualtrain.demo.TRAIN_CONTRACT` says what it computes."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax

from dualtrain import Craft, convert
from dualtrain.demo.loops import held_out_accuracy, learner_losses
from dualtrain.demo.runs import Factorization, Sweep
from dualtrain_jax.batching import BatchModule, batch_loss
from dualtrain_jax.batching.optim import member_optimizer
from dualtrain_jax.compilation import accelerate_model
from dualtrain_jax.craft import realize
from dualtrain_jax.embeddings import attach

__all__ = [
    "evaluate", "fit", "train", "train_embeddings", "train_parallel", "train_sweep",
]  # fmt: skip


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


def train_sweep(sweep: Sweep) -> list[list[float]]:
    """A learning-rate sweep as one BatchModule; the contract is `demo.sweep.SWEEP_CONTRACT`."""
    batch = sweep.members
    bm = BatchModule(realize(sweep.craft, seed=sweep.seed), batch, **sweep.batching)
    tx = member_optimizer("sgd", batch, lr=sweep.lrs)
    inputs, labels = convert((sweep.x, sweep.y), to="jax")

    @jax.jit
    def step(params: Any, state: Any, opt_state: Any) -> tuple[Any, Any, Any, jax.Array]:
        def loss_fn(params: Any) -> tuple[jax.Array, tuple[jax.Array, Any]]:
            out, new_state = bm.apply(params, state, inputs, train=True)
            losses = batch_loss(out, labels, batch)  # [batch]
            return losses.sum(), (losses, new_state)

        (_, (losses, state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, losses

    bm.train = True  # the sweep trains: BatchNorm uses batch statistics, per member
    bm.tune(inputs)  # outside jit: the strategy and the isolation verdict are settled here
    params, state, opt_state = bm.params, bm.state, tx.init(bm.params)
    losses = []
    for _ in range(sweep.steps):
        params, state, opt_state, loss = step(params, state, opt_state)
        losses.append(np.asarray(loss).tolist())
    return losses


def fit(
    craft: Craft, train: Any, *, epochs: int, lr: float, seed: int, dash: Any, test: Any = None,
    device: Any = None,
) -> tuple[Any, list[float], str]:  # fmt: skip
    """Adam on `train`'s batches (NCHW float images, int labels) for `epochs` epochs.

    The step goes through the compile ladder (JIT_DONATE, JIT, EAGER). Each step's loss is
    gauged as a device array (read every 5 steps); after each epoch, the accuracy on every
    row of `test`.
    """
    module = realize(craft, seed=seed, device=device)
    optimizer = optax.adam(lr)

    @accelerate_model(warm_steps=2)
    def step(params: Any, state: Any, opt_state: Any, images: Any, labels: Any) -> Any:
        def loss_fn(params: Any) -> tuple[jax.Array, Any]:
            logits, new_state = module.apply(params, state, images, train=True)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), new_state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    params, state, opt_state = module.params, module.state, optimizer.init(module.params)
    accuracies = []
    for epoch in range(1, epochs + 1):
        for mile, batch in enumerate(dash.feed(train), 1):
            params, state, opt_state, loss = step(
                params, state, opt_state, batch["image"], batch["label"]
            )
            dash.gauge({"loss": loss}, mile, epoch, train.batches_per_epoch, "train", interval=5,
                       samples=len(batch["label"]))  # fmt: skip
        module.params, module.state = params, state
        if test is not None:
            accuracies.append(held_out_accuracy(*evaluate(module, test), dash, epoch))
    return module, accuracies, step.explain().summary()


def evaluate(module: Any, tank: Any) -> tuple[np.ndarray, np.ndarray]:
    """Logits and labels of every row of one epoch of `tank` (its padding left out), in order."""
    logits, labels = [], []
    for batch in tank:
        keep = np.asarray(batch["mask"]) if "mask" in batch else slice(None)
        logits.append(np.asarray(_predict(module, batch["image"]))[keep])
        labels.append(np.asarray(batch["label"])[keep])
    return np.concatenate(logits), np.concatenate(labels)


@jax.jit
def _predict(module: Any, x: Any) -> Any:
    # The module is a pytree whose Craft is static: one compile per model, not per call.
    return module.apply(module.params, module.state, x, train=False)[0]


def train_parallel(
    mv: Any, craft: Craft, tank: Any, *, lr: float, steps: int, seed: int
) -> list[float]:
    """Data-parallel SGD under Multiverse `mv`: parameters replicated, batches split, jit."""
    learner = mv.learner(mv.sync(realize(craft, seed=seed), tank), optax.sgd(lr))
    return learner_losses(learner, tank, steps)


def train_embeddings(run: Factorization) -> list[float]:
    """The demo's factorization model; the contract is `demo.embeddings.EMBED_CONTRACT`."""
    users, items = run.stores()
    user_rows, item_rows = attach(users, optax.adam(run.lr)), attach(items, optax.adam(run.lr))

    @jax.jit
    @jax.value_and_grad
    def loss_and_grads(rows: Any, target: Any) -> jax.Array:
        u, v = rows
        return (((u * v).sum(1) - target) ** 2).mean()

    losses = []
    for k in range(run.steps):
        at = run.batch_rows(k)
        rows = (user_rows.fetch(run.users[at]), item_rows.fetch(run.items[at]))
        loss, (gu, gv) = loss_and_grads(rows, run.ratings[at])
        user_rows.step(gu)
        item_rows.step(gv)
        losses.append(float(loss))
    return losses
