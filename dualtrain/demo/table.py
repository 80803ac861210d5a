"""The demo's one table: each framework's losses side by side."""

from __future__ import annotations

from rich.table import Table

__all__ = ["loss_table"]

_LABEL = {"torch": "torch", "jax": "JAX"}


def loss_table(title: str, unit: str, losses: dict[str, list[float]], rows: int) -> Table:
    """The losses of each framework at about `rows` evenly spaced steps.

    With both torch and JAX, a last column gives their difference.
    """
    names = list(losses)
    steps = len(losses[names[0]])
    both = set(names) == {"torch", "jax"}
    table = Table(title=title)
    columns = [unit, *(f"{_LABEL.get(n, n)} loss" for n in names)]
    for column in [*columns, "|difference|"] if both else columns:
        table.add_column(column, justify="right")
    for i in sorted({*range(0, steps, max(1, steps // rows)), steps - 1}):
        cells = [f"{losses[n][i]:.6f}" for n in names]
        if both:
            cells.append(f"{abs(losses['torch'][i] - losses['jax'][i]):.1e}")
        table.add_row(str(i), *cells)
    return table
