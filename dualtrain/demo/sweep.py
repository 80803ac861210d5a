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

from dualtrain.craft import Craft
from dualtrain.demo.runs import Sweep
from dualtrain.demo.seams import demo_part

__all__ = ["SWEEP_CONTRACT", "run_sweep"]

SWEEP_CONTRACT = """
``train_sweep(sweep: Sweep) -> losses``, in each adapter's ``demo`` module: realize
``sweep.craft`` with ``sweep.seed``, batch ``sweep.members`` identical copies of it in a
BatchModule (``sweep.batching``) reading the same ``(sweep.x, sweep.y)``, and run
``sweep.steps`` full-batch SGD steps of softmax cross-entropy in training mode, member i with
learning rate ``sweep.lrs[i]`` (`member_optimizer`). Returns, for each step, the members'
losses before it (``steps`` lists of ``members``).
"""


def run_sweep(
    console: Console, craft: Craft, x: np.ndarray, y: np.ndarray, seed: int, steps: int = 30,
    names: tuple[str, ...] = ("torch", "jax"),
) -> dict[str, Any]:  # fmt: skip
    """Trains the sweep under each framework of `names`; prints the final losses per member."""
    lrs = np.logspace(-2, 1, 8)
    sweep = Sweep(craft, x, y, lrs=lrs, steps=steps, seed=seed)
    losses, seconds = {}, {}
    for name in names:
        started = time.perf_counter()
        part = demo_part(name)
        losses[name] = np.asarray(part.train_sweep(sweep))
        seconds[name] = time.perf_counter() - started
    table = Table(title=f"a learning-rate sweep: {len(lrs)} members in one BatchModule")
    both = len(names) == 2
    columns = ["lr", *(f"{_LABEL[n]} final loss" for n in names)]
    for column in [*columns, "|difference|"] if both else columns:
        table.add_column(column, justify="right")
    final = {name: curve[-1] for name, curve in losses.items()}
    for i, lr in enumerate(lrs):
        cells = [f"{final[n][i]:.6f}" for n in names]
        if both:
            cells.append(f"{abs(final['torch'][i] - final['jax'][i]):.1e}")
        table.add_row(f"{lr:.4g}", *cells)
    console.print(table)
    best = int(np.argmin(final[names[0]]))
    times = ", ".join(f"{_LABEL[n]} {seconds[n]:.2f} s" for n in names)
    jit = " (JAX includes its jit)" if "jax" in names else ""
    console.print(
        f"best lr {lrs[best]:.4g} after {steps} steps; {times} for all {len(lrs)} members{jit}"
    )
    return {
        "sweep_lrs": lrs.tolist(),
        **{f"sweep_{n}_losses": losses[n].tolist() for n in names},
        "sweep_seconds": seconds,
    }


_LABEL = {"torch": "torch", "jax": "JAX"}
