"""The demo's learning-rate sweep: N copies of one Craft trained as one BatchModule.

Each adapter's ``train_sweep`` follows `SWEEP_CONTRACT`; the demo prints the members' final
losses under torch and JAX side by side and names the best learning rate.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dualtrain import backends
from dualtrain.craft import Craft

__all__ = ["SWEEP_CONTRACT", "run_sweep"]

SWEEP_CONTRACT = """
``train_sweep(craft, x, y, *, lrs, steps, seed) -> losses``, in each adapter's ``demo``
module: realize `craft` with `seed`, batch ``len(lrs)`` identical copies of it in a
BatchModule reading the same ``(x, y)``, and run `steps` full-batch SGD steps of softmax
cross-entropy in training mode, member i with learning rate ``lrs[i]`` (`member_optimizer`).
Returns, for each step, the members' losses before it (``steps`` lists of ``len(lrs)``).
"""


def run_sweep(
    console: Console, craft: Craft, x: np.ndarray, y: np.ndarray, seed: int, steps: int = 30
) -> dict[str, Any]:
    """Trains the sweep under both frameworks and prints the final losses per member."""
    lrs = np.logspace(-2, 1, 8)
    losses, seconds = {}, {}
    for name in ("torch", "jax"):
        started = time.perf_counter()
        part = backends.load_part(name, "demo")
        losses[name] = np.asarray(part.train_sweep(craft, x, y, lrs=lrs, steps=steps, seed=seed))
        seconds[name] = time.perf_counter() - started
    table = Table(title=f"a learning-rate sweep: {len(lrs)} members in one BatchModule")
    for column in ("lr", "torch final loss", "JAX final loss", "|difference|"):
        table.add_column(column, justify="right")
    final = {name: curve[-1] for name, curve in losses.items()}
    for i, lr in enumerate(lrs):
        a, b = final["torch"][i], final["jax"][i]
        table.add_row(f"{lr:.4g}", f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.1e}")
    console.print(table)
    best = int(np.argmin(final["torch"]))
    console.print(
        f"best lr {lrs[best]:.4g} after {steps} steps; torch {seconds['torch']:.2f} s, "
        f"JAX {seconds['jax']:.2f} s for all {len(lrs)} members (JAX includes its jit)"
    )
    return {
        "sweep_lrs": lrs.tolist(),
        "sweep_torch_losses": losses["torch"].tolist(),
        "sweep_jax_losses": losses["jax"].tolist(),
        "sweep_seconds": seconds,
    }
