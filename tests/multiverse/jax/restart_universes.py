"""A JAX universe that resumes from its last anchor after a restart (restart laws).

Every step's data and dropout key come from (rank, step), so a run resumed at step k draws
what an uninterrupted run draws from step k on; the anchor holds the parameters and Adam's
state.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain import TimeMachine
from tests.multiverse.jax.distributed_universes import MLP, batch


def _host(tree: Any) -> dict[str, np.ndarray]:
    return {k: np.asarray(v.addressable_data(0)) for k, v in tree.items()}


def resumes(mv: Any, folder: str, steps: int, every: int, kill_at: int | None) -> Any:
    """`steps` Adam steps with an anchor every `every`; rank 1 SIGKILLs itself once, mid-step
    `kill_at` (its step dispatched, not awaited), on the first attempt."""
    import jax
    import optax

    from dualtrain_jax import realize

    run = Path(folder)
    learner = mv.learner(mv.sync(realize(MLP(), seed=0)), optax.adam(0.05))
    machine = mv.time_machine(TimeMachine(save_path=run / "anchors"))
    start = 0
    anchors = sorted((run / "anchors").glob("step*.safetensors"))
    if mv.restart_count > 0 and anchors:
        restored = machine.to(learner.model, anchors[-1], optimizer=learner.opt_state)
        learner.opt_state, start = restored.optimizer, restored.step
    for step in range(start, steps):
        x, y = batch(5000 + 100 * step + mv.rank, 4)
        loss = learner.step(x, y, rng=jax.random.fold_in(jax.random.key(1), step))
        if step == kill_at and mv.rank == 1 and not (run / "killed").exists():
            (run / "killed").touch()
            os.kill(os.getpid(), signal.SIGKILL)
        float(loss)
        if (step + 1) % every == 0:
            machine.drop(learner.model, f"step{step + 1:04d}", optimizer=learner.opt_state,
                         step=step + 1)  # fmt: skip
    params = _host(learner.model.params)
    return {"params": params, "restarts": mv.restart_count, "start": start} if mv.is_main else None


def stalls(mv: Any, folder: str, rank: int) -> None:
    """Learner steps; after step 2 rank `rank` sleeps for good, the other steps on and waits."""
    import optax

    from dualtrain_jax import realize

    learner = mv.learner(mv.sync(realize(MLP(), seed=0)), optax.sgd(0.1))
    for step in range(1000):
        if step == 2 and mv.rank == rank:
            time.sleep(3600)
        float(learner.step(*batch(100 * step + mv.rank, 4)))
