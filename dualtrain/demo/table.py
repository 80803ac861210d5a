"""The demo's one table: torch's and JAX's losses side by side."""

from __future__ import annotations

from rich.table import Table

__all__ = ["loss_table"]


def loss_table(title: str, unit: str, losses: dict[str, list[float]], rows: int) -> Table:
    """Torch's and JAX's losses side by side at about `rows` evenly spaced steps."""
    steps = len(losses["torch"])
    table = Table(title=title)
    for column in (unit, "torch loss", "JAX loss", "|difference|"):
        table.add_column(column, justify="right")
    for i in sorted({*range(0, steps, max(1, steps // rows)), steps - 1}):
        a, b = losses["torch"][i], losses["jax"][i]
        table.add_row(str(i), f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.1e}")
    return table
