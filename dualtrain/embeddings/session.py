"""What both adapters' attachments share: staging buffers, ordering, modes, counters.

An attachment trains one store. Per step it gathers the batch's unique rows of the table
and of every state table into reused staging buffers (two sets, so a prefetch fills one
while the other is in use), lets the adapter update them, and scatters them back. All
gathers and scatters run in FIFO order on one worker thread, which is what orders a
write-back before any later gather of the same rows; a batch prefetched before the
write-back of an overlapping batch is patched with the updated rows.

Modes:
    lazy: a row (and its state) changes only when a batch touches it; step counts and
        other step-dependent scalars are global (like torch's SparseAdam, TF's LazyAdam).
    exact: each row remembers the last step it took part in (`store.counters`); when a
        batch touches it again, it first takes the zero-gradient steps it missed, so the
        result equals dense training of the whole table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from dualtrain.embeddings.ids import Lookup, lookup
from dualtrain.embeddings.store import EmbeddingStore
from dualtrain.errors import ArgumentError, bad_argument

__all__ = ["MODES", "Batch", "RowSession"]

MODES = ("lazy", "exact")
WEIGHT = "weight"  # the table's name among the staged arrays


@dataclasses.dataclass
class Batch:
    """One batch's staged rows.

    Attributes:
        lookup: the ids, their unique rows and inverse.
        rows: staged arrays by name (``"weight"`` and each state slot), each [capacity, dim];
            the first ``len(lookup.unique)`` rows are the batch's, the rest padding.
        ready: the gather in flight, or None once done.
    """

    lookup: Lookup
    rows: dict[str, np.ndarray]
    ready: Future | None = None

    @property
    def size(self) -> int:
        """Unique rows in the batch."""
        return int(self.lookup.unique.size)

    def wait(self) -> Batch:
        if self.ready is not None:
            self.ready.result()
            self.ready = None
        return self


class RowSession:
    """Staging, ordering and bookkeeping of one attachment (adapters build on it).

    Args:
        store: the store to train.
        slots: initial row of each optimizer-state slot ([dim] or scalar), by name.
        mode: "lazy" or "exact".
        pad: rows to stage for a batch of n unique rows (>= n); JAX pads to few shapes.
    """

    def __init__(
        self,
        store: EmbeddingStore,
        slots: dict[str, np.ndarray],
        mode: str,
        pad: Callable[[int], int] = lambda n: n,
    ) -> None:
        if not isinstance(store, EmbeddingStore):
            raise bad_argument("store", type(store).__name__, "a dualtrain.EmbeddingStore")
        if mode not in MODES:
            raise bad_argument("mode", mode, f"one of {MODES}")
        store.allocate_state(slots, counters=mode == "exact")
        store.session = self
        self.store, self.mode, self.pad = store, mode, pad
        self.names = [WEIGHT, *slots]
        self.t = 0  # steps taken
        self._sets: list[dict[str, np.ndarray]] = [{}, {}]
        self._turn = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dualtrain-rows")
        self._pending: list[Future] = []
        self.current: Batch | None = None
        self.prefetched: Batch | None = None

    # ---- staging -----------------------------------------------------------------------

    def tables(self) -> dict[str, np.ndarray]:
        return {WEIGHT: self.store.table, **self.store.state}

    def _buffers(self, n: int) -> dict[str, np.ndarray]:
        staged = self._sets[self._turn]
        self._turn ^= 1
        cap = self.pad(n)
        for name in self.names:
            if name not in staged or len(staged[name]) < cap:
                buf = self.store.empty(max(cap, int(len(staged.get(name, ())) * 1.25)))
                buf[...] = 0  # padding rows stay finite
                staged[name] = buf
        return {name: staged[name][:cap] for name in self.names}

    def _gather(self, batch: Batch) -> None:
        n, unique = batch.size, batch.lookup.unique
        for name, table in self.tables().items():
            # Ids were range-checked once in `lookup`; "clip" skips NumPy's per-id check,
            # which costs 2.5x (it buffers `out` in order to be able to raise).
            np.take(table, unique, axis=0, out=batch.rows[name][:n], mode="clip")

    def _submit(self, fn: Callable[..., None], *args: Any) -> Future:
        self._pending = [f for f in self._pending if not f.done() or f.exception()]
        future = self._pool.submit(fn, *args)
        self._pending.append(future)
        return future

    # ---- the step ----------------------------------------------------------------------

    def begin(self, ids: tuple[Any, ...]) -> Batch:
        """Makes `ids` the current batch, staged (from the prefetch when ids match)."""
        found = lookup(ids, self.store.num_rows)
        batch, self.prefetched = self.prefetched, None
        if batch is None or not found.same_ids(batch.lookup):
            batch = Batch(found, self._buffers(found.unique.size))
            batch.ready = self._submit(self._gather, batch)
        self.current = batch.wait()
        return self.current

    def prefetch(self, ids: tuple[Any, ...]) -> None:
        """Starts gathering `ids` in the background for the next `begin` with equal ids."""
        found = lookup(ids, self.store.num_rows)
        batch = Batch(found, self._buffers(found.unique.size))
        batch.ready = self._submit(self._gather, batch)
        self.prefetched = batch

    def require_current(self) -> Batch:
        if self.current is None:
            raise ArgumentError("step() needs a batch: call rows.fetch(ids) first")
        return self.current

    def missed(self, batch: Batch, fresh_identity: bool) -> tuple[range, np.ndarray]:
        """Exact mode: the steps to replay (tau) and each row's last step.

        A row is replayed at tau while its last step < tau. Rows never touched skip replay
        when a zero-gradient step from the
        initial state is the identity (`fresh_identity`).
        """
        if self.mode != "exact" or self.store.counters is None:
            return range(0), np.zeros(0, np.int64)
        last = self.store.counters[batch.lookup.unique]
        if fresh_identity:
            last = np.where(last == 0, self.t, last)
        first = int(last.min()) + 1 if last.size else self.t + 1
        return range(first, self.t + 1), last

    def finish(
        self,
        batch: Batch,
        updated: dict[str, np.ndarray],
        before: Callable[[], Any] | None = None,
        advance: bool = True,
    ) -> None:
        """Records a taken step and writes `updated` ([>= U, dim] per name) back, async.

        `updated` holds host arrays or anything ``np.asarray`` reads (a JAX array: the
        worker then also waits for the computation).

        `before` runs on the worker first (a CUDA event's synchronize: the copy to host).
        With `advance` false the rows were only caught up (exact mode), no step was taken.
        """
        self.t += advance
        unique = batch.lookup.unique
        if self.store.counters is not None:
            self.store.counters[unique] = self.t
        self._submit(self._scatter, unique, updated, before)
        if self.prefetched is not None:  # FIFO: its gather is done when the patch runs
            self.prefetched.ready = self._submit(self._patch, self.prefetched, unique, updated)
        self.current = None

    def _scatter(
        self, unique: np.ndarray, updated: dict[str, np.ndarray], before: Callable | None
    ) -> None:
        if before is not None:
            before()
        n = unique.size
        for name, table in self.tables().items():
            table[unique] = np.asarray(updated[name])[:n]

    def _patch(self, later: Batch, unique: np.ndarray, updated: dict[str, np.ndarray]) -> None:
        # `later` was gathered before this write-back; copy the updated rows it shares.
        _, ours, theirs = np.intersect1d(
            unique, later.lookup.unique, assume_unique=True, return_indices=True
        )
        for name in self.names:
            later.rows[name][theirs] = np.asarray(updated[name])[ours]

    def stale(self, fresh_identity: bool, chunk: int = 65536) -> list[np.ndarray]:
        """Exact mode: the rows behind the current step, in chunks (see `settle`)."""
        if self.mode != "exact" or self.store.counters is None:
            return []
        self.flush()
        counters = self.store.counters
        behind = (counters < self.t) & ((counters > 0) if fresh_identity else True)
        rows = np.flatnonzero(behind)
        return [rows[i : i + chunk] for i in range(0, rows.size, chunk)]

    def abandon(self) -> None:
        """Drops the current batch after a failed step: nothing of it is written back."""
        self.current = None

    def flush(self) -> None:
        """Waits for every gather and write-back; re-raises a worker's error."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def detach(self) -> None:
        """Flushes and releases the store (its tables stay)."""
        self.flush()
        self._pool.shutdown(wait=True)
        self.store.session = None
