"""A metric's recent history as text: `span` columns, `divisor` rows, labelled Y axis."""

from __future__ import annotations

import math

__all__ = ["curve_lines"]


def curve_lines(values: list[float], span: int, divisor: int, title: str = "") -> list[str]:
    """The last `span` finite values drawn as a dot curve over `divisor` rows.

    Returns ``divisor + 1`` lines: the rows top (largest) first, each with its Y label, then
    an axis line holding `title`. A flat curve sits on the middle row; no values give an
    empty frame.
    """
    shown = [v for v in values if math.isfinite(v)][-span:]
    grid = [[" "] * span for _ in range(divisor)]
    if shown:
        low, high = min(shown), max(shown)
        for col, v in enumerate(shown):
            if high > low:
                row = min(divisor - 1, int((v - low) / (high - low) * divisor))
            else:
                row = divisor // 2
            grid[divisor - 1 - row][col] = "•"
    else:
        low = high = math.nan
    lines = []
    for i, cells in enumerate(grid):
        # Labels: the top row's top edge, the middle row's, and the bottom row's bottom edge.
        level = low if i == divisor - 1 else high - (high - low) * i / divisor
        label = f"{level:>10.4g}" if shown and i in (0, divisor - 1, divisor // 2) else " " * 10
        lines.append(f"{label} ┤{''.join(cells)}")
    lines.append(" " * 11 + "└" + f" {title} ".center(span, "─")[:span])
    return lines
