"""Universes the torch Multiverse tests spawn, and the data and models their references share.

Spawned workers import a universe by name, so it lives at the top level of a module; the
test (the parent) rebuilds the same models and batches from the same seeds to compute the
single-process reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn import functional as F  # noqa: N812 - torch's own spelling

from dualtrain import Craft, dock
from dualtrain.errors import ArgumentError
from dualtrain_torch import realize
from dualtrain_torch.distributed.exit import in_flight, release

ROWS, FEATURES, CLASSES, STEPS = 4, 5, 3, 3  # rows per rank and step
KINDS = ("craft", "module")
OPTIMIZERS = ("sgd", "adam")
MASKED_ROWS = (5, 3)  # rank r holds MASKED_ROWS[r] rows (pad-and-mask), VALID[r] valid
VALID = (3, 1)
UNEVEN_ROWS = (6, 2)  # a 0-d mean loss over unequal batches


class Tiny(Craft):
    """Dense -> tanh -> Dense: (B, FEATURES) -> (B, CLASSES) logits."""

    def __init__(self) -> None:
        super().__init__("TINY")
        self.fc1 = dock.Dense(FEATURES, 8)
        self.fc2 = dock.Dense(8, CLASSES)

    def run(self, x: Any) -> Any:
        return self.fc2(dock.tanh(self.fc1(x)))


def model(kind: str, seed: int) -> nn.Module:
    """A fresh model whose initial weights depend on `seed` only."""
    if kind == "craft":
        return realize(Tiny(), seed=seed)
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES))


def wide_model(seed: int) -> nn.Module:
    """A model of 1.3 MB of parameters: several DDP buckets (the first holds 1 MiB)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(FEATURES, 300), nn.Tanh(), nn.Linear(300, 1000), nn.Tanh(),
        nn.Linear(1000, CLASSES),
    )  # fmt: skip


def bag_model(seed: int) -> nn.Module:
    """Bags of 3 ids out of 20 -> 8 features (a sparse gradient) -> CLASSES logits."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.EmbeddingBag(20, 8, mode="sum", sparse=True), nn.Linear(8, CLASSES))


def bag_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + 100 * rank + step)
    n = UNEVEN_ROWS[rank]
    return torch.randint(0, 20, (n, 3), generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def batches(nworld: int) -> tuple[torch.Tensor, torch.Tensor]:
    """STEPS global batches: inputs (STEPS, nworld * ROWS, FEATURES), classes (STEPS, ...)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(STEPS, nworld * ROWS, FEATURES, generator=g)
    return x, torch.randint(0, CLASSES, (STEPS, nworld * ROWS), generator=g)


def masked_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank `rank`'s padded batch at `step`: inputs, classes, mask (VALID[rank] rows True).

    Padded rows hold large values: counted by mistake, they would move the loss a lot.
    """
    g = torch.Generator().manual_seed(100 * rank + step)
    n, valid = MASKED_ROWS[rank], VALID[rank]
    x = torch.randn(n, FEATURES, generator=g)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.randperm(n, generator=g)[:valid]] = True
    x[~mask] = 50.0
    return x, torch.randint(0, CLASSES, (n,), generator=g), mask


def uneven_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + 100 * rank + step)
    n = UNEVEN_ROWS[rank]
    return torch.randn(n, FEATURES, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def empty_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of no rows (a rank whose share of the step is empty)."""
    return torch.zeros(0, FEATURES), torch.zeros(0, dtype=torch.long)


def mean_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A loss that returns the batch's mean (0-d), not per-sample losses."""
    return F.cross_entropy(outputs, targets)


def reduce_value(rank: int) -> dict[str, Any]:
    """What rank `rank` reduces: every kind of leaf reduce takes."""
    r = rank + 1
    return {
        "tensor": torch.arange(6, dtype=torch.float32).reshape(2, 3) * r + 0.25,
        "ints": torch.tensor([1, 2, 3], dtype=torch.int32) * r,
        "float": 1.5 * r,
        "int": 3 * r,
        "array": np.linspace(0.0, 1.0, 4) * r,
        "scalar": np.float32(0.5 * r),
        "nested": (np.arange(3) * r, [torch.tensor(2.0 * r)]),
    }


def portable(value: Any) -> Any:
    """`value` with each tensor as ("torch", dtype, array): a worker's result travels
    pickled, and a pickled tensor points into the worker's shared memory, gone at its exit."""
    if isinstance(value, torch.Tensor):
        return ("torch", str(value.dtype).removeprefix("torch."), value.numpy())
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(portable(v) for v in value)
    return value


def params(module: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def laws(mv: Any) -> list[dict[str, Any]] | None:
    """Every 2-process law in one run; rank 0 returns every rank's numbers (by rank)."""
    rank, nworld = mv.rank, mv.nworld
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    x, y = batches(nworld)
    out: dict[str, Any] = {
        "nworld": nworld,
        "backend": mv.runtime.backend,
        "batch_device": mv.runtime.batch_device("torch"),
    }
    # The learner: each rank starts from its own weights; sync must give it rank 0's.
    for kind in KINDS:
        for opt in OPTIMIZERS:
            net = model(kind, seed=rank)
            learner = mv.learner(net, optimizer(opt, net.parameters()))
            losses = [float(learner.step(x[k, rows], y[k, rows])) for k in range(STEPS)]
            out[f"learner/{kind}/{opt}"] = (losses, params(mv.runtime.unwrap(learner.model)))
    # A hand-written DDP loop on the synced model.
    net = model("module", seed=rank)
    synced = mv.sync(net)
    # DDP lacks `append`: the synced model answers it with the wrapped Sequential's.
    out["forwarded"] = synced.append.__self__ is net and mv.runtime.unwrap(synced) is net
    sgd = optimizer("sgd", net.parameters())
    for k in range(STEPS):
        sgd.zero_grad()
        F.cross_entropy(synced(x[k, rows]), y[k, rows]).backward()
        sgd.step()
    out["manual"] = params(net)
    # Pad-and-mask: ranks hold different numbers of rows and of valid rows.
    net = model("module", seed=rank)
    learner = mv.learner(net, optimizer("sgd", net.parameters()))
    losses = []
    for k in range(STEPS):
        inputs, targets, mask = masked_batch(rank, k)
        losses.append(float(learner.step(inputs, targets, mask=mask)))
    out["masked"] = (losses, params(net))
    # A 0-d mean loss over unequal batches: still the global mean.
    net = model("module", seed=rank)
    learner = mv.learner(net, optimizer("adam", net.parameters()), loss_fn=mean_loss)
    out["uneven"] = (
        [float(learner.step(*uneven_batch(rank, k))) for k in range(STEPS)],
        params(net),
    )
    # A 0-d mean loss where rank 1 holds no rows: the mean over rank 0's, not NaN.
    net = model("module", seed=rank)
    learner = mv.learner(net, optimizer("adam", net.parameters()), loss_fn=mean_loss)
    steps = [uneven_batch(0, k) if rank == 0 else empty_batch() for k in range(STEPS)]
    out["empty"] = ([float(learner.step(*batch)) for batch in steps], params(net))
    # reduce of layouts that differ by rank (dict keys in another order): refused on every
    # rank, and the run goes on.
    keys = ("a", "b") if rank == 0 else ("b", "a")
    try:
        mv.reduce({key: float(i) for i, key in enumerate(keys)})
        out["mismatch"] = "reduced"
    except ArgumentError as err:
        out["mismatch"] = str(err)
    # reduce: on a copy, never in place.
    value, before = reduce_value(rank), reduce_value(rank)
    out["mean"] = portable(mv.reduce(value))
    out["sum"] = portable(mv.reduce(value, aggregate=True))
    out["unchanged"] = (
        all(torch.equal(value[k], before[k]) for k in ("tensor", "ints"))
        and value["float"] == before["float"]
        and np.array_equal(value["array"], before["array"])
    )
    # no_sync: two local micro-batches, then one synced backward reduces all three.
    net = model("module", seed=rank)
    synced = mv.sync(net)
    with mv.no_sync(synced):
        for k in range(2):
            F.cross_entropy(synced(x[k, rows]), y[k, rows]).backward()
    out["local_grad"] = net[0].weight.grad.clone().numpy()
    F.cross_entropy(synced(x[2, rows]), y[2, rows]).backward()
    out["accumulated_grad"] = net[0].weight.grad.clone().numpy()
    out["steps"] = mv.step
    # The Multiverse's DDP options reach a learner's DDP (a world of one has no DDP).
    net = model("module", seed=rank)
    learner = mv.learner(net, optimizer("sgd", net.parameters()))
    out["ddp"] = (type(learner.model).__name__, learner.model.find_unused_parameters,
                  learner.model.bucket_bytes_cap)  # fmt: skip
    # A learner step runs the collectives DDP by hand runs (its rows ride in DDP's first
    # bucket), counted by the group's sequence number; a hand-written loop on a learner's
    # model still gets DDP's mean; a model with the user's own comm hook keeps it and pays
    # two scalar all-reduces more, for the same law.
    group = torch.distributed.group.WORLD
    net = model("module", seed=rank)
    learner = mv.learner(net, optimizer("sgd", net.parameters()))
    before = group._get_sequence_number_for_group()
    learner.step(x[0, rows], y[0, rows])
    stepped = group._get_sequence_number_for_group() - before
    sgd = learner.optimizer  # its momentum goes on
    before = group._get_sequence_number_for_group()
    sgd.zero_grad()
    F.cross_entropy(learner.model(x[1, rows]), y[1, rows]).backward()
    sgd.step()
    by_hand = group._get_sequence_number_for_group() - before
    out["collectives"] = (stepped, by_hand)
    out["hand_after_learner"] = params(net)
    try:  # after a learner's step, the model's one comm hook is the learner's
        learner.model.register_comm_hook(None, allreduce_hook)
        out["late_hook"] = "registered"
    except ArgumentError as err:
        out["late_hook"] = str(err)
    net = model("module", seed=rank)
    synced = mv.sync(net)
    learner = mv.learner(synced, optimizer("sgd", net.parameters()))
    synced.register_comm_hook(None, allreduce_hook)  # after the learner, before its step
    before = group._get_sequence_number_for_group()
    losses = [float(learner.step(x[k, rows], y[k, rows])) for k in range(STEPS)]
    out["own_hook"] = ((losses, params(net)), group._get_sequence_number_for_group() - before)
    # Several buckets: every one is divided by the global rows, after the first's sum.
    net = wide_model(seed=rank)
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.25)
    learner = mv.learner(ddp, optimizer("sgd", net.parameters()))
    before = group._get_sequence_number_for_group()
    losses = [float(learner.step(*uneven_batch(rank, k))) for k in range(STEPS)]
    out["buckets"] = ((losses, params(net)), group._get_sequence_number_for_group() - before)
    # A sparse gradient (EmbeddingBag(sparse=True)) has a bucket of its own with no dense
    # tail: the rows are summed apart, and the law holds.
    net = bag_model(seed=rank)
    learner = mv.learner(net, optimizer("sgd", net.parameters()))
    before = group._get_sequence_number_for_group()
    losses = [float(learner.step(*bag_batch(rank, k))) for k in range(STEPS)]
    out["sparse"] = ((losses, params(net)), group._get_sequence_number_for_group() - before)
    # A DDP over a process group of its own: the learner's collectives run on that group.
    subgroup = torch.distributed.new_group([0, 1])
    net = model("module", seed=rank)
    ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=subgroup)
    learner = mv.learner(ddp, optimizer("sgd", net.parameters()))
    on_world, on_group = (
        group._get_sequence_number_for_group(), subgroup._get_sequence_number_for_group()
    )  # fmt: skip
    losses = [float(learner.step(x[k, rows], y[k, rows])) for k in range(STEPS)]
    out["subgroup"] = (
        (losses, params(net)),
        group._get_sequence_number_for_group() - on_world,
        subgroup._get_sequence_number_for_group() - on_group,
    )
    # Each rank a DDP of its own (a group of one): the learner's rows, loss and scaling are
    # that group's, on the hook's path and on the fallback's (a sparse gradient) alike.
    alone = [torch.distributed.new_group([r]) for r in range(nworld)][rank]
    for name, make, batch in (("alone/dense", wide_model, uneven_batch),
                              ("alone/sparse", bag_model, bag_batch)):  # fmt: skip
        net = make(seed=0)
        ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=alone)
        learner = mv.learner(ddp, optimizer("sgd", net.parameters()))
        losses = [float(learner.step(*batch(rank, k))) for k in range(STEPS)]
        out[name] = (losses, params(net))
    # What leaving waits for: gloo's threads have dropped every tensor the adapter handed
    # them (an abort at exit, now and then, otherwise: dualtrain_torch.distributed.exit).
    mv.reduce(float(rank))
    mv.runtime.gather_object(rank)
    out["released"] = (release(limit_s=60.0), in_flight())
    everyone = mv.runtime.gather_object(out)
    return everyone if rank == 0 else None
