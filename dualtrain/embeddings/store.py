"""EmbeddingStore: a huge table and its optimizer-state tables in host memory.

The store holds rows; an adapter's ``attach`` trains them. ``dualtrain_torch.attach`` and
``dualtrain_jax.attach`` add one state table per optimizer slot (Adam's two moments, ...)
and move only the rows a batch touches to the device and back.
"""

from __future__ import annotations

import contextlib
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

    Reading `table`, `state` or `counters` first waits for the attachment's write-backs in
    flight, so what it returns includes every step already returned (write-backs stay
    asynchronous between reads). What it returns is the live array, not a copy: later steps
    change it (see docs/embeddings.md, "Reading the store").

    Attributes:
        table: the host table, an ndarray [num_rows, dim].
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
        # The live arrays. The attachment's worker writes them; public reads go through the
        # properties below, which wait for it first.
        self._table = self.empty()
        fill(self._table, init, std, self.seed)
        self._state: dict[str, np.ndarray] = {}
        self._counters: np.ndarray | None = None
        self.session: Any = None  # the attachment training this store, if any

    @property
    def table(self) -> np.ndarray:
        """The host table [num_rows, dim], with every step already returned written back."""
        self.flush()
        return self._table

    @property
    def state(self) -> dict[str, np.ndarray]:
        """Optimizer-state tables by slot name, with every step already returned in them."""
        self.flush()
        return self._state

    @property
    def counters(self) -> np.ndarray | None:
        """Exact mode's per-row step counters (int64 [num_rows]), or None in lazy mode."""
        self.flush()
        return self._counters

    def live(self) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """The table, state tables and counters without waiting: for the attachment itself.

        Its worker thread writes them; a read from elsewhere must use the properties.
        """
        return self._table, self._state, self._counters

    def held(self) -> contextlib.AbstractContextManager[None]:
        """Holds the attachment (no step runs) for the block; nothing to hold when detached."""
        return self.session.owned() if self.session is not None else contextlib.nullcontext()

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
        with self.held():  # no step of another thread writes rows while they are refilled
            self.flush()
            fill(self._table, init, std, seed)

    def allocate_state(self, slots: dict[str, np.ndarray], counters: bool) -> None:
        """Adds one table per slot, every row set to ``slots[name]`` ([dim] or a scalar).

        Called by an adapter's attach; a store trains under one attachment at a time.
        """
        if self.session is not None:
            raise ArgumentError(
                "this EmbeddingStore is already attached to an optimizer; call "
                "rows.detach() on the old attachment first"
            )
        self._state = {}
        for name, row in slots.items():
            table = self.empty()
            table[...] = np.broadcast_to(np.asarray(row), (self.dim,))
            self._state[name] = table
        self._counters = np.zeros(self.num_rows, np.int64) if counters else None

    def flush(self) -> None:
        """Waits until every asynchronous write-back of the attachment has landed."""
        if self.session is not None:
            self.session.flush()

    def memory(self) -> MemoryReport:
        """Host bytes of the table, the state tables and the counters.

        Sizes only, which no step changes: it does not wait for write-backs.
        """
        table, states, counters_table = self.live()
        state = {k: int(v.nbytes) for k, v in states.items()}
        counters = 0 if counters_table is None else int(counters_table.nbytes)
        total = int(table.nbytes) + sum(state.values()) + counters
        return MemoryReport(
            int(table.nbytes), state, counters, total, total / self.num_rows, self.pinned
        )

    def __repr__(self) -> str:
        report = self.memory()
        return (
            f"EmbeddingStore({self.num_rows} x {self.dim} {self.dtype}, state="
            f"{sorted(report.state)}, {report.total / 2**20:.1f} MiB"
            f"{', pinned' if self.pinned else ''})"
        )


def _check_init(init: object) -> None:
    if not (callable(init) or (isinstance(init, str) and init in INITS)):
        raise bad_argument("init", init, f"one of {INITS} or a callable init(rows, rng)")


def _np_dtype(name: str) -> np.dtype:
    return dtypes.numpy_dtype(name)  # bfloat16 through ml_dtypes: dualtrain.dtypes
