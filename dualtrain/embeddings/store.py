"""EmbeddingStore: a huge table and its optimizer-state tables in host memory.

The store holds rows; an adapter's ``attach`` trains them. ``dualtrain_torch.attach`` and
``dualtrain_jax.attach`` add one state table per optimizer slot (Adam's two moments, ...)
and move only the rows a batch touches to the device and back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from typing import Any

import numpy as np

from dualtrain import backends, dtypes
from dualtrain.embeddings.init import INITS, Init, fill
from dualtrain.embeddings.sharding import Exchange, Shard, split
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
        per_row: `total` / the rows held (this process's range on a shard).
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

    The table is allocated and filled at its first use (a read, ``attach``), not here, so a
    store made and then sharded by ``mv.sync(store)`` only ever holds its own range.

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
        num_rows: rows in the whole table (ids are in [0, num_rows)).
        rows: the ids this store holds: ``range(num_rows)``, or a shard's range.
        shard: the `Shard` after ``mv.sync(store)`` in a run of several processes, or None.
        table: the host table, an ndarray [len(rows), dim]: row k is id ``rows.start + k``.
        state: optimizer-state tables by slot name, each [len(rows), dim], set by attach.
        counters: exact mode's per-row step counters, int64 [len(rows)], or None.
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
        self.rows = range(num_rows)
        self.shard: Shard | None = None
        self._init, self._std = init, std  # drawn at the first use (`live`)
        # The live arrays. The attachment's worker writes them; public reads go through the
        # properties below, which wait for it first.
        self._table: np.ndarray | None = None
        self._allocating = threading.Lock()
        self._state: dict[str, np.ndarray] = {}
        self._counters: np.ndarray | None = None
        self.session: Any = None  # the attachment training this store, if any

    @property
    def table(self) -> np.ndarray:
        """The host table [num_rows, dim], with every step already returned written back."""
        self.flush()
        return self.live()[0]

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

        Its worker thread writes them; a read from elsewhere must use the properties. The
        first call allocates the table and draws its rows.
        """
        if self._table is None:
            with self._allocating:
                if self._table is None:
                    table = self.empty()
                    self._fill(table, self._init, self._std, self.seed)
                    self._table = table
        return self._table, self._state, self._counters

    @property
    def allocated(self) -> bool:
        """Whether the table has been allocated (it is at its first use)."""
        return self._table is not None

    def _fill(self, table: np.ndarray, init: Init, std: float, seed: int) -> None:
        fill(table, init, std, seed, first=self.rows.start, num_rows=self.num_rows)

    def make_shard(self, rank: int, world: int, exchange: Exchange) -> None:
        """Makes this store rank `rank`'s shard of `world` (what ``mv.sync(store)`` calls).

        Keeps only ids ``split(num_rows, world)[rank:rank + 2]``; a table already allocated
        is cut to them (each row keeps its value). Refused once attached: sync first.
        """
        if self.session is not None:
            raise ArgumentError(
                "sync the EmbeddingStore (mv.sync(store)) before attaching it to an optimizer; "
                "this one is attached: call rows.detach() first"
            )
        if self.shard is not None or self.rows != range(self.num_rows):
            raise ArgumentError(
                f"this EmbeddingStore is already a shard (ids {self.rows.start}.."
                f"{self.rows.stop - 1} of {self.num_rows}); sync each store once"
            )
        if world < 1 or not 0 <= rank < world:
            raise bad_argument("rank", rank, f"a rank in [0, {world})")
        shard = Shard(rank, world, split(self.num_rows, world), exchange)
        if world == 1:
            return
        whole, self._table = self._table, None
        self.rows, self.shard = shard.rows, shard
        if whole is not None:  # allocated before the sync: keep this rank's rows
            self._table = self.empty()
            self._table[...] = whole[self.rows.start : self.rows.stop]
        # A detached attachment's state and counters cover the whole table: this rank's rows
        # of them stay (the next attach makes its own anyway), the rest is freed.
        part = slice(self.rows.start, self.rows.stop)
        self._state = {name: table[part].copy() for name, table in self._state.items()}
        if self._counters is not None:
            self._counters = self._counters[part].copy()

    def signature(self) -> tuple[Any, ...]:
        """What makes this store's rows: (num_rows, dim, dtype, seed, std, init).

        The processes of a run compare it before sharding (a callable init by its name).
        """
        init = (
            self._init
            if isinstance(self._init, str)
            else getattr(self._init, "__qualname__", type(self._init).__qualname__)
        )
        return (self.num_rows, self.dim, self.dtype, self.seed, self._std, init)

    def stats(self) -> dict[str, Any]:
        """What this store holds: ids, shape, bytes and steps taken (this process's shard).

        Returns:
            ``{"rows": (start, stop), "num_rows", "dim", "dtype", "bytes", "steps",
            "rank", "world", "traffic"}``; `bytes` as `memory` reports them; `traffic` what
            the shard's exchanges moved (``sharding.Traffic`` as a dict), None unsharded.
        """
        return {
            "rows": (self.rows.start, self.rows.stop),
            "num_rows": self.num_rows,
            "dim": self.dim,
            "dtype": self.dtype,
            "bytes": self.memory().total,
            "steps": self.session.t if self.session is not None else 0,
            "rank": self.shard.rank if self.shard is not None else 0,
            "world": self.shard.world if self.shard is not None else 1,
            "traffic": None if self.shard is None else dataclasses.asdict(self.shard.traffic),
        }

    def held(self) -> contextlib.AbstractContextManager[None]:
        """Holds the attachment (no step runs) for the block; nothing to hold when detached."""
        return self.session.owned() if self.session is not None else contextlib.nullcontext()

    def empty(self, rows: int | None = None) -> np.ndarray:
        """An uninitialized [rows, dim] host buffer like the table's (pinned if it is).

        `rows` defaults to the rows this store holds (``len(self.rows)``).
        """
        shape = (len(self.rows) if rows is None else rows, self.dim)
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
            self._fill(self.live()[0], init, std, seed)

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
        self.live()  # the table first: an attached store has it
        self._counters = np.zeros(len(self.rows), np.int64) if counters else None

    def flush(self) -> None:
        """Waits until every asynchronous write-back of the attachment has landed."""
        if self.session is not None:
            self.session.flush()

    def memory(self) -> MemoryReport:
        """Host bytes of the table, the state tables and the counters.

        Sizes only, which no step changes: it does not wait for write-backs. What is
        allocated now: a table not used yet counts 0 bytes.
        """
        table = 0 if self._table is None else int(self._table.nbytes)
        state = {k: int(v.nbytes) for k, v in self._state.items()}
        counters = 0 if self._counters is None else int(self._counters.nbytes)
        total = table + sum(state.values()) + counters
        return MemoryReport(
            table, state, counters, total, total / max(len(self.rows), 1), self.pinned
        )

    def __repr__(self) -> str:
        report = self.memory()
        part = "" if self.shard is None else f", ids {self.rows.start}..{self.rows.stop - 1}"
        return (
            f"EmbeddingStore({self.num_rows} x {self.dim} {self.dtype}{part}, state="
            f"{sorted(report.state)}, {report.total / 2**20:.1f} MiB"
            f"{', pinned' if self.pinned else ''})"
        )


def _check_init(init: object) -> None:
    if not (callable(init) or (isinstance(init, str) and init in INITS)):
        raise bad_argument("init", init, f"one of {INITS} or a callable init(rows, rng)")


def _np_dtype(name: str) -> np.dtype:
    return dtypes.numpy_dtype(name)  # bfloat16 through ml_dtypes: dualtrain.dtypes
