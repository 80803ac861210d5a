"""The demo's training loop in torch: `dualtrain.demo.TRAIN_CONTRACT` says what it computes."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from dualtrain import Craft, convert
from dualtrain.demo.loops import held_out_accuracy, learner_losses
from dualtrain.demo.runs import Factorization, Sweep
from dualtrain_torch.batching import BatchModule, batch_loss
from dualtrain_torch.batching.optim import member_optimizer
from dualtrain_torch.compilation import accelerate, explain
from dualtrain_torch.craft import Nozzle, Rudder, realize
from dualtrain_torch.embeddings import attach

__all__ = [
    "evaluate", "fit", "train", "train_embeddings", "train_parallel", "train_sweep",
]  # fmt: skip

LADDER = ("CHANNELS_LAST", "ONNXRUNTIME", "PYTORCH")  # the demo's rungs (compile-free)


def train(
    craft: Craft, x: np.ndarray, y: np.ndarray, *, lr: float, steps: int, seed: int
) -> tuple[list[float], Any]:
    """The demo's training loop; the contract is `dualtrain.demo.TRAIN_CONTRACT`."""
    module = realize(craft, seed=seed)
    inputs, labels = convert((x, y), to="torch")
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    losses = []
    with Rudder(module):
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(module(inputs), labels.long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, module


def train_sweep(sweep: Sweep) -> list[list[float]]:
    """A learning-rate sweep as one BatchModule; the contract is `demo.sweep.SWEEP_CONTRACT`."""
    batch = sweep.members
    bm = BatchModule(realize(sweep.craft, seed=sweep.seed), batch, **sweep.batching)
    optimizer = member_optimizer(bm, "sgd", batch, lr=sweep.lrs)
    inputs, labels = convert((sweep.x, sweep.y), to="torch")
    targets = labels.long()
    losses = []
    with Rudder(bm):
        for _ in range(sweep.steps):
            loss = batch_loss(bm(inputs), targets, batch)  # [batch]
            optimizer.zero_grad()
            loss.sum().backward()  # member i's gradient is its own loss's
            optimizer.step()
            losses.append(loss.tolist())
    return losses


def fit(
    craft: Craft, train: Any, *, epochs: int, lr: float, seed: int, dash: Any, test: Any = None,
    device: Any = None,
) -> tuple[Any, list[float], str]:  # fmt: skip
    """Adam on `train`'s batches (NCHW float images, int labels) for `epochs` epochs.

    The forward goes through the compile ladder. Each step's loss is gauged as a tensor
    (read every 5 steps); after each epoch, the accuracy on every row of `test`.
    """
    module = accelerate(realize(craft, seed=seed, device=device), LADDER, warm_steps=2)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    accuracies = []
    for epoch in range(1, epochs + 1):
        with Rudder(module):
            for mile, batch in enumerate(dash.feed(train), 1):
                loss = torch.nn.functional.cross_entropy(module(batch["image"]),
                                                         batch["label"].long())  # fmt: skip
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                dash.gauge({"loss": loss.detach()}, mile, epoch, train.batches_per_epoch, "train",
                           interval=5, samples=len(batch["label"]))  # fmt: skip
        if test is not None:
            accuracies.append(held_out_accuracy(*evaluate(module, test), dash, epoch))
    return module, accuracies, explain(module).summary()


def evaluate(module: Any, tank: Any) -> tuple[np.ndarray, np.ndarray]:
    """Logits and labels of every row of one epoch of `tank` (its padding left out), in order."""
    logits, labels = [], []
    with Nozzle(module):
        for batch in tank:
            keep = batch["mask"] if "mask" in batch else slice(None)
            logits.append(module(batch["image"])[keep].cpu().numpy())
            labels.append(batch["label"][keep].cpu().numpy())
    return np.concatenate(logits), np.concatenate(labels)


def train_parallel(
    mv: Any, craft: Craft, tank: Any, *, lr: float, steps: int, seed: int
) -> list[float]:
    """Data-parallel SGD under Multiverse `mv`: DDP over gloo (nccl on CUDA) underneath."""
    module = realize(craft, seed=seed)
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    learner = mv.learner(mv.sync(module, tank), optimizer)
    return learner_losses(learner, tank, steps)


def train_embeddings(run: Factorization) -> list[float]:
    """The demo's factorization model; the contract is `demo.embeddings.EMBED_CONTRACT`."""
    users, items = run.stores()
    user_rows = attach(users, torch.optim.Adam, lr=run.lr)
    item_rows = attach(items, torch.optim.Adam, lr=run.lr)
    target = torch.from_numpy(run.ratings)
    losses = []
    for k in range(run.steps):
        at = run.batch_rows(k)
        u = cast(torch.Tensor, user_rows.fetch(run.users[at]))  # one ids array: one tensor
        v = cast(torch.Tensor, item_rows.fetch(run.items[at]))
        loss = (((u * v).sum(1) - target[at]) ** 2).mean()
        loss.backward()
        user_rows.step()
        item_rows.step()
        losses.append(loss.item())
    return losses
