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

Threads:
    One attachment may be used from several threads. A thread's ``fetch`` opens a batch
    that the same thread closes with ``step`` (or ``release``); until then every other
    thread's ``fetch``, ``prefetch`` and ``settle`` wait. A fetch..step sequence therefore
    runs as one unit: no update is lost even when threads touch the same rows, and the
    attachment's staging and optimizer are never shared mid-step. A batch left open by a
    thread that has ended is dropped (nothing written back) when another thread needs it.

Reads:
    Write-backs stay asynchronous; the store's public reads (``store.table``, ``state``,
    ``counters``) wait for those in flight (`flush`, safe from any thread), so they include
    every step already returned. The worker itself uses ``store.live()``, which does not
    wait. Checkpoints also hold the session (`owned`), so no step runs while rows are
    written to a file or loaded from one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
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
        slot: which of the two staging sets `rows` lies in.
    """

    lookup: Lookup
    rows: dict[str, np.ndarray]
    ready: Future | None = None
    slot: int = 0

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
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dualtrain-rows")
        self._pending: list[Future] = []
        self._pending_lock = threading.Lock()
        # Ownership: the thread with an open batch (or inside a session call) holds the
        # session; `_holds` counts its nested calls. Others wait on `_free`.
        self._free = threading.Condition(threading.RLock())
        self._owner: threading.Thread | None = None
        self._holds = 0
        self._current: Batch | None = None
        self.prefetched: Batch | None = None

    # ---- threads -----------------------------------------------------------------------

    @property
    def current(self) -> Batch | None:
        """The open batch (fetched, not yet stepped), or None."""
        return self._current

    @current.setter
    def current(self, batch: Batch | None) -> None:
        # Closing the batch (None) frees the session for other threads unless a call of
        # the owner is still running.
        with self._free:
            self._current = batch
            if batch is None:
                self._release_if_idle()

    @contextlib.contextmanager
    def owned(self) -> Iterator[None]:
        """Holds the session for this thread for the block, waiting while another holds it.

        The hold outlasts the block while this thread has an open batch (fetched, not yet
        stepped or released).
        """
        me = threading.current_thread()
        with self._free:
            while self._owner is not None and self._owner is not me:
                if not self._owner.is_alive():  # it fetched and ended: drop its batch
                    self._current, self._owner, self._holds = None, None, 0
                    break
                self._free.wait(0.05)
            self._owner = me
            self._holds += 1
        try:
            yield
        finally:
            with self._free:
                self._holds -= 1
                self._release_if_idle()

    def _release_if_idle(self) -> None:
        # Called with `_free` held.
        if self._holds == 0 and self._current is None:
            self._owner = None
            self._free.notify_all()

    def _close(self) -> None:
        """Ends the current batch (stepped or dropped) and frees the session if idle."""
        self.current = None

    # ---- staging -----------------------------------------------------------------------

    def tables(self) -> dict[str, np.ndarray]:
        # The live arrays: the worker calls this, and the store's properties wait for it.
        table, state, _ = self.store.live()
        return {WEIGHT: table, **state}

    def _buffers(self, n: int) -> tuple[int, dict[str, np.ndarray]]:
        # Never the set of the batch in use: its rows are the live parameter until step.
        # (A set still read by a queued write-back is safe: the worker runs in order.)
        slot = 1 - self.current.slot if self.current is not None else 0
        if self.current is None and self.prefetched is not None:
            slot = 1 - self.prefetched.slot
        staged = self._sets[slot]
        cap = self.pad(n)
        for name in self.names:
            if name not in staged or len(staged[name]) < cap:
                buf = self.store.empty(max(cap, int(len(staged.get(name, ())) * 1.25)))
                buf[...] = 0  # padding rows stay finite
                staged[name] = buf
        return slot, {name: staged[name][:cap] for name in self.names}

    def _gather(self, batch: Batch) -> None:
        n, unique = batch.size, batch.lookup.unique
        for name, table in self.tables().items():
            # Ids were range-checked once in `lookup`; "clip" skips NumPy's per-id check,
            # which costs 2.5x (it buffers `out` in order to be able to raise).
            np.take(table, unique, axis=0, out=batch.rows[name][:n], mode="clip")

    def _submit(self, fn: Callable[..., None], *args: Any) -> Future:
        with self._pending_lock:
            self._pending = [f for f in self._pending if not f.done() or f.exception()]
            future = self._pool.submit(fn, *args)
            self._pending.append(future)
        return future

    # ---- the step ----------------------------------------------------------------------

    def begin(self, ids: tuple[Any, ...]) -> Batch:
        """Makes `ids` the current batch, staged (from the prefetch when ids match).

        The calling thread holds the session from here until `finish` or `abandon`; another
        thread's `begin` waits until then.
        """
        found = lookup(ids, len(self.store.rows))
        with self.owned():
            self.current = None  # a fetch again without step replaces the batch
            batch, self.prefetched = self.prefetched, None
            if batch is None or not found.same_ids(batch.lookup):
                slot, rows = self._buffers(found.unique.size)
                batch = Batch(found, rows, slot=slot)
                batch.ready = self._submit(self._gather, batch)
            try:
                self.current = batch.wait()
            except BaseException:
                self.current = None
                raise
        return self.current

    def prefetch(self, ids: tuple[Any, ...]) -> None:
        """Starts gathering `ids` in the background for the next `begin` with equal ids."""
        found = lookup(ids, len(self.store.rows))
        with self.owned():
            slot, rows = self._buffers(found.unique.size)
            batch = Batch(found, rows, slot=slot)
            batch.ready = self._submit(self._gather, batch)
            self.prefetched = batch

    def holds(self) -> bool:
        """Whether this thread has the open batch (fetched, not yet stepped)."""
        with self._free:
            return self.current is not None and self._owner is threading.current_thread()

    def require_current(self) -> Batch:
        """The batch this thread fetched; ArgumentError when it has none open."""
        with self._free:
            mine = self._owner is threading.current_thread()
            if self.current is None or not mine:
                where = "" if self.current is None else " (another thread's batch is open)"
                raise ArgumentError(
                    "step() needs a batch fetched in this thread: call rows.fetch(ids) "
                    f"first{where}"
                )
            return self.current

    def missed(self, batch: Batch, fresh_identity: bool) -> tuple[range, np.ndarray]:
        """Exact mode: the steps to replay (tau) and each row's last step.

        A row is replayed at tau while its last step < tau. Rows never touched skip replay
        when a zero-gradient step from the
        initial state is the identity (`fresh_identity`).
        """
        counters = self.store.live()[2]
        if self.mode != "exact" or counters is None:
            return range(0), np.zeros(0, np.int64)
        last = counters[batch.lookup.unique]
        if fresh_identity:
            last = np.where(last == 0, self.t, last)
        first = int(last.min()) + 1 if last.size else self.t + 1
        return range(first, self.t + 1), last

    def finish(
        self,
        batch: Batch,
        updated: dict[str, Any],
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
        counters = self.store.live()[2]
        if counters is not None:  # written here, not by the worker: the next fetch reads them
            counters[unique] = self.t
        self._submit(self._scatter, unique, updated, before)
        if self.prefetched is not None:  # FIFO: its gather is done when the patch runs
            self.prefetched.ready = self._submit(self._patch, self.prefetched, unique, updated)
        self._close()

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
        counters = self.store.live()[2]
        if self.mode != "exact" or counters is None:
            return []
        self.flush()
        behind = (counters < self.t) & ((counters > 0) if fresh_identity else True)
        rows = np.flatnonzero(behind)
        return [rows[i : i + chunk] for i in range(0, rows.size, chunk)]

    def abandon(self) -> None:
        """Drops the current batch (a failed step, or `release`): nothing is written back."""
        if self.current is not None and self._owner is threading.current_thread():
            self._close()

    def flush(self) -> None:
        """Waits for every gather and write-back submitted so far; re-raises a worker's error.

        Safe from any thread: each caller waits for all of them (a flush that took the list
        away would let a second thread's flush return while the first still waited).
        """
        with self._pending_lock:
            pending = list(self._pending)
        error = None
        for future in pending:
            exc = future.exception()  # waits for it
            error = error or exc
        waited = {id(f) for f in pending}
        with self._pending_lock:
            self._pending = [f for f in self._pending if id(f) not in waited]
        if error is not None:
            raise error

    def detach(self) -> None:
        """Flushes and releases the store (its tables stay)."""
        with self.owned():
            self.current = None
            self.flush()
            self._pool.shutdown(wait=True)
            self.store.session = None
