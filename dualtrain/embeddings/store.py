"""EmbeddingStore: a huge table and its optimizer-state tables in host memory.

The store holds rows; an adapter's ``attach`` trains them. ``dualtrain_torch.attach`` and
``dualtrain_jax.attach`` add one state table per optimizer slot (Adam's two moments, ...)
and move only the rows a batch touches to the device and back.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np

from dualtrain import backends, dtypes
from dualtrain.embeddings.init import INITS, Init, fill
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.memory import aligned_empty
from dualtrain.validate import check_finite, check_int, check_seed

__all__ = ["EmbeddingStore", "MemoryReport"]

_DTYPES = dtypes.FLOAT_NAMES  # the table's float names: dualtrain.dtypes


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Host bytes held by a store.

    Attributes:
        table: bytes of the row table.
        state: bytes per optimizer-state table, by slot name.
        counters: bytes of the per-row step counters (exact mode), 0 without.
        total: all of the above.
        per_row: `total` / num_rows.
        pinned: whether the tables are page-locked (they cannot be swapped out).
    """

    table: int
    state: dict[str, int]
    counters: int
    total: int
    per_row: float
    pinned: bool


def _cuda_torch() -> bool:
    """Whether torch is already imported and sees a GPU (dualtrain never imports it itself)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


class EmbeddingStore:
    """A [num_rows, dim] table in host memory, trained row-wise by ``attach``.

    Args:
        num_rows: rows in the table.
        dim: values per row.
        dtype: "float32", "float64", "float16" or "bfloat16".
        init: "zeros", "normal" (N(0, std^2)), "uniform" (same std) or a callable
            ``init(rows, rng) -> [len(rows), dim]`` (int64 row ids, a NumPy generator).
        std: standard deviation of "normal" and "uniform": finite and >= 0.
        seed: an int in [0, 2**64); rows are a function of (seed, row) only.
        pinned: page-locked host memory through torch (True: required, needs torch and
            CUDA; None: when torch is imported and sees a GPU; False: plain memory).

    Attributes:
        table: the host table, an ndarray [num_rows, dim] (read it after ``flush()``).
        state: optimizer-state tables by slot name, each [num_rows, dim], set by attach.
        counters: exact mode's per-row step counters, int64 [num_rows], or None.
    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        dtype: str = "float32",
        init: Init = "normal",
        std: float = 0.01,
        seed: int = 0,
        pinned: bool | None = None,
    ) -> None:
        num_rows = check_int("num_rows", num_rows, minimum=1)
        dim = check_int("dim", dim, minimum=1)
        if str(dtype) not in _DTYPES:
            raise bad_argument("dtype", dtype, f"one of {_DTYPES}")
        _check_init(init)
        std = check_finite("std", std, 0.0, expected="a finite number >= 0")
        seed = check_seed("seed", seed)
        if pinned is not None and not isinstance(pinned, (bool, np.bool_)):
            raise bad_argument("pinned", pinned, "True, False or None (auto)")
        if pinned and not _cuda_torch():
            raise bad_argument(
                "pinned", pinned, "False or None: pinned memory needs torch with CUDA"
            )
        self.num_rows, self.dim = num_rows, dim
        self.dtype = str(dtype)
        self.seed = seed
        self.pinned = bool(pinned) if pinned is not None else _cuda_torch()
        self.table = self.empty()
        fill(self.table, init, std, self.seed)
        self.state: dict[str, np.ndarray] = {}
        self.counters: np.ndarray | None = None
        self.session: Any = None  # the attachment training this store, if any

    def empty(self, rows: int | None = None) -> np.ndarray:
        """An uninitialized [rows, dim] host buffer like the table's (pinned if it is)."""
        shape = (self.num_rows if rows is None else rows, self.dim)
        if self.pinned:
            return backends.load_part("torch", "embeddings").pinned_empty(shape, self.dtype)
        return aligned_empty(shape, _np_dtype(self.dtype))

    def initialize(self, init: Init = "normal", std: float = 0.01, seed: int | None = None) -> None:
        """Refills the table in place (state tables are left as they are).

        Args:
            init: as for the constructor.
            std: as for the constructor.
            seed: an int in [0, 2**64); default the store's own seed.
        """
        _check_init(init)
        std = check_finite("std", std, 0.0, expected="a finite number >= 0")
        seed = self.seed if seed is None else check_seed("seed", seed)
        self.flush()
        fill(self.table, init, std, seed)

    def allocate_state(self, slots: dict[str, np.ndarray], counters: bool) -> None:
        """Adds one table per slot, every row set to ``slots[name]`` ([dim] or a scalar).

        Called by an adapter's attach; a store trains under one attachment at a time.
        """
        if self.session is not None:
            raise ArgumentError(
                "this EmbeddingStore is already attached to an optimizer; call "
                "rows.detach() on the old attachment first"
            )
        self.state = {}
        for name, row in slots.items():
            table = self.empty()
            table[...] = np.broadcast_to(np.asarray(row), (self.dim,))
            self.state[name] = table
        self.counters = np.zeros(self.num_rows, np.int64) if counters else None

    def flush(self) -> None:
        """Waits until every asynchronous write-back of the attachment has landed."""
        if self.session is not None:
            self.session.flush()

    def memory(self) -> MemoryReport:
        """Host bytes of the table, the state tables and the counters."""
        state = {k: int(v.nbytes) for k, v in self.state.items()}
        counters = 0 if self.counters is None else int(self.counters.nbytes)
        total = int(self.table.nbytes) + sum(state.values()) + counters
        return MemoryReport(
            int(self.table.nbytes), state, counters, total, total / self.num_rows, self.pinned
        )

    def __repr__(self) -> str:
        report = self.memory()
        return (
            f"EmbeddingStore({self.num_rows} x {self.dim} {self.dtype}, state="
            f"{sorted(self.state)}, {report.total / 2**20:.1f} MiB"
            f"{', pinned' if self.pinned else ''})"
        )


def _check_init(init: object) -> None:
    if not (callable(init) or (isinstance(init, str) and init in INITS)):
        raise bad_argument("init", init, f"one of {INITS} or a callable init(rows, rng)")


def _np_dtype(name: str) -> np.dtype:
    return dtypes.numpy_dtype(name)  # bfloat16 through ml_dtypes: dualtrain.dtypes
