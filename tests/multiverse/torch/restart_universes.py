"""A torch universe that resumes from its last anchor after a restart (restart laws).

Every step's data and dropout mask are drawn from seeds of (rank, step), so a run resumed
at step k draws what an uninterrupted run draws from step k on; the anchor holds the model
and Adam's state.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812 - torch's own spelling

from dualtrain import TimeMachine
from dualtrain_torch import realize
from tests.multiverse.torch.distributed_universes import CLASSES, FEATURES, ROWS, Tiny


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s batch of step `step` (the same in every attempt)."""
    g = torch.Generator().manual_seed(5000 + 100 * step + rank)
    return torch.randn(ROWS, FEATURES, generator=g), torch.randint(0, CLASSES, (ROWS,), generator=g)


def resumes(mv: Any, folder: str, steps: int, every: int, kill_at: int | None) -> Any:
    """`steps` Adam steps with an anchor every `every`; rank 1 SIGKILLs itself once, mid-step
    `kill_at` (after its forward), on the first attempt. Rank 0 returns the final parameters."""
    run = Path(folder)
    machine = mv.time_machine(TimeMachine(save_path=run / "anchors"))
    model = mv.sync(realize(Tiny(), seed=0))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    start = 0
    anchors = sorted((run / "anchors").glob("step*.safetensors"))
    if mv.restart_count > 0 and anchors:
        start = machine.to(model, anchors[-1], optimizer=optimizer).step
    for step in range(start, steps):
        torch.manual_seed(9000 + 100 * step + mv.rank)  # the dropout's stream, by step
        x, y = batch(mv.rank, step)
        loss = F.cross_entropy(model(F.dropout(x, 0.25, training=True)), y)
        if step == kill_at and mv.rank == 1 and not (run / "killed").exists():
            (run / "killed").touch()
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: forward done, no backward
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % every == 0:
            machine.drop(model, f"step{step + 1:04d}", optimizer=optimizer, step=step + 1)
    state = mv.runtime.unwrap(model).state_dict()
    return {
        "params": {k: v.detach().numpy().copy() for k, v in state.items()},
        "restarts": mv.restart_count,
        "start": start,
    } if mv.is_main else None  # fmt: skip


def stalls(mv: Any, folder: str, rank: int, learner: bool) -> None:
    """Steps (a learner's, or forwards and backwards of a synced model); after step 2 rank
    `rank` sleeps for good, the other steps on and waits in its collective."""
    import time

    model = mv.sync(realize(Tiny(), seed=0))
    taught = mv.learner(model, torch.optim.SGD(model.parameters(), lr=0.1)) if learner else None
    for step in range(1000):
        if step == 2 and mv.rank == rank:
            time.sleep(3600)
        x, y = batch(mv.rank, step)
        if taught is not None:
            taught.step(x, y)  # counted at its end: its start is told (on_begin)
        else:
            F.cross_entropy(model(x), y).backward()  # counted as the forward starts
