"""Universes that train under a framework (spawned workers import them by name)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain import Craft, TimeMachine, dock

ROWS = 6  # rows per worker and step


class TwoLayer(Craft):
    """Dense 5 -> 7, tanh, Dense 7 -> 3."""

    def __init__(self) -> None:
        super().__init__("TWO")
        self.fc1 = dock.Dense(5, 7)
        self.fc2 = dock.Dense(7, 3)

    def run(self, x: Any) -> Any:
        return self.fc2(dock.tanh(self.fc1(x)))


def batches(steps: int, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """`steps` global batches of `workers` x ROWS rows: x (steps, n, 5), y (steps, n)."""
    rng = np.random.default_rng(7)
    n = workers * ROWS
    return (rng.normal(size=(steps, n, 5)).astype(np.float32),
            rng.integers(0, 3, (steps, n)).astype(np.int64))  # fmt: skip


def torch_drops_mid_training(mv: Any, folder: str, lr: float) -> dict[str, Any]:
    """Two SGD steps on 2 workers, rank 0 drops an anchor, one more step; logits of a probe."""
    import torch

    import dualtrain_torch

    x, y = batches(3, mv.nworld)
    mine = slice(mv.rank * ROWS, (mv.rank + 1) * ROWS)
    model = dualtrain_torch.realize(TwoLayer(), seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    learner = mv.learner(mv.sync(model), optimizer)
    machine = mv.time_machine(TimeMachine(save_path=folder, max_anchors=1))
    probe = torch.from_numpy(x[0])
    for step in range(3):
        learner.step(torch.from_numpy(x[step][mine]), torch.from_numpy(y[step][mine]))
        if step == 1:
            anchor = machine.drop(learner.model, step=2)
            with torch.no_grad():
                at_anchor = mv.runtime.unwrap(learner.model)(probe).numpy()
    with torch.no_grad():
        after = mv.runtime.unwrap(learner.model)(probe).numpy()
    return {"anchor": str(anchor), "at_anchor": at_anchor, "after": after}


def jax_resumes(mv: Any, anchor: str, lr: float) -> dict[str, Any]:
    """Loads the torch anchor into a fresh JAX module, one SGD step on the whole batch."""
    import jax.numpy as jnp
    import optax

    import dualtrain_jax

    x, y = batches(3, 2)
    module = dualtrain_jax.realize(TwoLayer(), seed=123)  # other weights until loaded
    TimeMachine().to(module, file=anchor, frozen=True)  # new arrays, in the same module
    at_anchor = np.asarray(module(jnp.asarray(x[0])))
    learner = mv.learner(mv.sync(module), optax.sgd(lr))
    learner.step(jnp.asarray(x[2]), jnp.asarray(y[2].astype(np.int32)))
    return {"at_anchor": at_anchor, "after": np.asarray(learner.model(jnp.asarray(x[0])))}


class Recorder:
    """A TimeMachine stand-in that logs which rank wrote and read (to one shared file)."""

    def __init__(self, folder: str, rank: int) -> None:
        self.folder, self.rank, self.save_path = folder, rank, folder

    def _log(self, what: str) -> None:
        with open(f"{self.folder}/log", "a") as f:
            f.write(f"{what} {self.rank}\n")

    def drop(self, model: Any, fail: bool = False) -> str:
        self._log("drop")
        if fail:
            raise ValueError("disk full")
        return f"{self.folder}/anchor-{self.rank}"

    def to(self, model: Any) -> str:
        self._log("to")
        return "read"


def rank_zero_then_death(mv: Any, folder: str) -> None:
    """Rank 0 writes, every rank reads, a failed write reaches all; then rank 1 is killed
    while rank 0 waits in a collective."""
    import json
    import os
    import signal

    from dualtrain import CheckpointError

    mv.init()
    machine = mv.time_machine(Recorder(folder, mv.rank))
    seen: dict[str, Any] = {"dropped": machine.drop(None), "read": machine.to(None)}
    try:
        machine.drop(None, fail=True)
    except CheckpointError as err:
        seen["failed"] = ("CheckpointError", str(err))
    except ValueError as err:
        seen["failed"] = ("ValueError", str(err))
    seen["save_path"] = machine.save_path
    with open(f"{folder}/rank{mv.rank}.json", "w") as f:
        json.dump(seen, f)
    mv.barrier()
    if mv.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    mv.barrier()  # rank 0: gloo's error when rank 1's connection closes
