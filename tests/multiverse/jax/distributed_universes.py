"""Universes and references for tests/multiverse/jax/test_distributed.py.

Spawned workers import a universe by name, so the ones that run in other processes live at
the top level of this module; the single-device references the laws compare with are here
too, shared by the test process and the workers.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax

from dualtrain import ArgumentError, Craft, Tank, dock

FEATURES, CLASSES = 6, 3
SPEC = {"image": "uint8", "label": "int32"}


class MLP(Craft):
    """A small classifier: ``(B, FEATURES) -> (B, CLASSES)`` logits."""

    def __init__(self, scope: str = "MLP") -> None:
        super().__init__(scope)
        self.fc1 = dock.Dense(FEATURES, 8)
        self.fc2 = dock.Dense(8, CLASSES)

    def run(self, x: Any) -> Any:
        return self.fc2(dock.tanh(self.fc1(x)))


def optimizer(name: str, lr: float) -> optax.GradientTransformation:
    """ "sgd" or "adam" at learning rate `lr`."""
    return optax.sgd(lr) if name == "sgd" else optax.adam(lr)


def batch(seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs ``(rows, FEATURES)`` float32 and integer labels ``(rows,)``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    return x, rng.integers(0, CLASSES, rows).astype(np.int32)


def image_loss(params: Any, inputs: Any, targets: Any) -> Any:
    """A linear classifier of a Tank's uint8 images (plain params pytree): per-sample losses."""
    x = inputs.reshape(inputs.shape[0], -1).astype(np.float32) / 255.0
    logits = x @ params["w"] + params["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets)


def reference(
    net: Any, name: str, lr: float, batches: list[tuple[Any, Any, Any]]
) -> tuple[dict[str, Any], list[float]]:
    """Plain single-device steps of `net` (a realized module) on whole batches, no jit.

    Each batch is ``(x, y, mask or None)``; the loss is the mean cross-entropy over the
    rows the mask keeps. Returns the final params and each step's loss.
    """
    tx = optimizer(name, lr)
    params, state = net.params, net.state
    opt_state, losses = tx.init(params), []
    for x, y, mask in batches:

        def loss(p: Any, x: Any = x, y: Any = y, mask: Any = mask) -> Any:
            out, _ = net.apply(p, state, x, train=True)
            each = optax.softmax_cross_entropy_with_integer_labels(out, y)
            return each.mean() if mask is None else (each * mask).sum() / mask.sum()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(value))
    return {k: np.asarray(v) for k, v in params.items()}, losses


def two_processes(mv: Any, x: np.ndarray, y: np.ndarray, pack: str) -> dict[str, Any]:
    """Every law of the 2-process run, measured once (spawns are expensive).

    Rows ``x[r * b:(r + 1) * b]`` are rank r's share of the global batch ``x``. Returns,
    on rank 0: per engine and optimizer the losses of 3 steps and every rank's final params
    (gathered), the reductions, a gathered object, and a step on a Tank's sharded batch.
    """
    from dualtrain_jax import realize

    mv.init()
    rank, b = mv.rank, len(x) // mv.processes
    mine = slice(rank * b, (rank + 1) * b)
    # A different seed per rank: sync must give every rank rank 0's parameters.
    net = mv.sync(realize(MLP(), seed=rank))
    out: dict[Any, Any] = {"nworld": mv.nworld, "local": mv.runtime.local_devices}
    for engine in ("jit", "pmap"):
        for name in ("sgd", "adam"):
            learner = mv.learner(net, optimizer(name, 0.05), engine=engine)
            losses = [float(learner.step(x[mine], y[mine])) for _ in range(3)]
            params = {k: np.asarray(v.addressable_data(0)) for k, v in learner.model.params.items()}
            out[engine, name] = (losses, mv.runtime.gather_object(params))
    value = {"f": 1.5 * (rank + 1), "a": np.arange(3.0) * (rank + 2), "i": rank + 1}
    out["mean"], out["sum"] = mv.reduce(value), mv.reduce(value, aggregate=True)
    out["gathered"] = mv.runtime.gather_object(("rank", rank))
    try:  # keys that differ by rank: refused on every rank, never averaged "b" with "c"
        out["mismatch"] = mv.reduce({"a": 1.0, "bc"[rank]: 10.0**rank})
    except ArgumentError as err:
        out["mismatch"] = str(err)
    tank = Tank(pack, SPEC, 4, shuffle=False, to="jax", cast="same_kind")
    mv.sync((), data=tank)
    first = tank.next()
    params = mv.sync(
        {"w": np.zeros((4 * 4 * 3, CLASSES), np.float32), "b": np.zeros(CLASSES, np.float32)}
    )
    learner = mv.learner(params, optax.sgd(0.5), loss_fn=image_loss)
    pmapped = mv.learner(params, optax.sgd(0.5), loss_fn=image_loss, engine="pmap")
    out["tank"] = (
        str(first["image"].sharding.spec),
        first["image"].shape,
        float(learner.step(first["image"], first["label"])),
        {k: np.asarray(v.addressable_data(0)) for k, v in learner.model.items()},
    )
    out["tank pmap"] = (  # the global batch split where it lies, under pmap
        float(pmapped.step(first["image"], first["label"])),
        {k: np.asarray(v.addressable_data(0)) for k, v in pmapped.model.items()},
    )
    mv.barrier()
    return out
