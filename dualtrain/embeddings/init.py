"""Filling a table block by block, each row a function of (seed, row) only.

Rows are drawn in fixed blocks of `BLOCK` rows, each block from its own Philox stream keyed
by (seed, block index): ``dualtrain.random.stream(seed, "rows", block)``. A row's values
therefore do not depend on the table's size, on how the work is split, or on anything drawn
before it, and no temporary of the whole table is ever made: peak extra memory is one block.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dualtrain.errors import ShapeError, bad_argument
from dualtrain.random import stream

__all__ = ["BLOCK", "INITS", "fill"]

BLOCK = 4096  # rows per stream; part of the format of "rows reproducible per (seed, row)"
INITS = ("zeros", "uniform", "normal")

Init = str | Callable[[np.ndarray, np.random.Generator], Any]


def _draw(init: Init, rows: np.ndarray, dim: int, std: float, rng: np.random.Generator) -> Any:
    if init == "normal":
        return rng.standard_normal((rows.size, dim), dtype=np.float64) * std
    if init == "uniform":  # the same standard deviation as "normal": bound = sqrt(3) * std
        bound = math.sqrt(3.0) * std
        return rng.uniform(-bound, bound, (rows.size, dim))
    assert callable(init)
    return init(rows, rng)


def fill(
    table: np.ndarray,
    init: Init,
    std: float,
    seed: int,
    start: int = 0,
    stop: int | None = None,
    *,
    first: int = 0,
    num_rows: int | None = None,
) -> None:
    """Writes rows [start, stop) of `table` ([n, dim]) from `init`, block by block.

    `table` may hold a slice of a larger table (a shard): its row k is row ``first + k`` of a
    table of `num_rows` rows, and each row gets the value it has in the whole table.

    Args:
        table: the host table, written in place.
        init: "zeros", "uniform" (U(-a, a), a = sqrt(3) * std), "normal" (N(0, std^2)), or a
            callable ``init(rows, rng) -> array [len(rows), dim]`` given int64 row ids and a
            generator keyed by (seed, block).
        std: standard deviation of "normal" and "uniform".
        seed: the table's seed.
        start: the first row to write (an id of the whole table).
        stop: one past the last row to write (default: the table's last); whole blocks are
            drawn, rows outside [start, stop) are not written.
        first: the id of `table`'s row 0 in the whole table.
        num_rows: rows in the whole table (default ``first + len(table)``).
    """
    held, dim = table.shape
    num_rows = first + held if num_rows is None else num_rows
    start = max(start, first)
    stop = first + held if stop is None else min(stop, first + held)
    if stop <= start:
        return
    if init == "zeros":
        table[start - first : stop - first] = 0
        return
    if not (init in INITS or callable(init)):
        raise bad_argument("init", init, f"one of {INITS} or a callable init(rows, rng)")
    for block in range(start // BLOCK, -(-stop // BLOCK)):
        lo, hi = max(block * BLOCK, start), min((block + 1) * BLOCK, stop)
        rows = np.arange(block * BLOCK, min((block + 1) * BLOCK, num_rows), dtype=np.int64)
        values = np.asarray(_draw(init, rows, dim, std, stream(seed, "rows", block)))
        if values.shape != (rows.size, dim):
            raise ShapeError(
                f"init returned shape {values.shape} for {rows.size} rows; expected "
                f"({rows.size}, {dim})"
            )
        offset = block * BLOCK
        table[lo - first : hi - first] = values[lo - offset : hi - offset]
