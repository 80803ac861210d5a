"""The batch pipeline behind a Tank: prepares batches ahead, in threads or processes.

A batch is cut into one chunk per worker; each chunk runs fetch_fn and prep_fn on its rows
(inside the sample's `sample_scope`, so a Comburant draws by (seed, epoch, row)) and, with
the default collate, copies its samples straight into the batch's arrays, in parallel.
Batches come out in order whatever the worker count, and equal for any worker count.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

import numpy as np

from dualtrain.errors import ArgumentError, ShapeError, TankWorkerError
from dualtrain.fuel.streams import SampleKey, sample_scope
from dualtrain.memory import aligned_empty

if TYPE_CHECKING:
    from dualtrain.fuel.preloading import Lead

__all__ = ["Pipeline", "Recipe"]

Fn = Callable[..., Any]


class Recipe:
    """What to do with each row: picklable, so worker processes get it whole.

    Args:
        data: what fetch_fn reads (a Pack: its `check` guards every part of a batch).
        fetch_fn, prep_fn: ``fetch_fn(data, index)``, then ``prep_fn(sample)``.
        seed: the Tank's seed (the sample's key).
        finish_fn: ``finish_fn(sample, source, index)`` after prep_fn (the Tank's layout and
            scale; `source` names the callback whose output it reads, for its errors).
        dict_samples: the samples must be dicts (for the default collate): a prep_fn (or,
            without one, a fetch_fn) returning anything else is an ArgumentError naming it.
        fixed: keys whose values the default collate must stack (a pack column of one
            shape: a row that returns another shape or dtype is a ShapeError naming it).
        gather: ``gather(data, rows, blocks) -> ({key: values}, lost)``, the columns read
            for a set of rows at once (a `ColumnGather`; default collate only). fetch_fn
            then reads the other columns row by row, and is None when there are none.
        keys: the batch's keys in order, when `gather` is given.
        whole_row: with `gather`, a fetch_fn reading every column of a row: the row a
            gathered cast lost a value in is read with it, so the error raised is the
            row-by-row read's (the first failing column of that row).
    """

    def __init__(
        self, data: Any, fetch_fn: Fn | None, prep_fn: Fn | None, seed: int,
        finish_fn: Fn | None = None, dict_samples: bool = False,
        fixed: frozenset[str] = frozenset(), gather: Fn | None = None,
        keys: tuple[str, ...] = (), whole_row: Fn | None = None,
    ) -> None:  # fmt: skip
        self.data, self.fetch_fn, self.prep_fn, self.seed = data, fetch_fn, prep_fn, seed
        self.finish_fn, self.dict_samples, self.fixed = finish_fn, dict_samples, fixed
        self.gather, self.keys, self.whole_row = gather, keys, whole_row
        # The callback whose output the later steps read: named in their errors.
        self.source = "prep_fn" if prep_fn is not None else "fetch_fn"

    def check(self, rows: np.ndarray) -> None:
        """Raises if the files holding `rows` changed on disk (a Pack's `check`)."""
        check = getattr(self.data, "check", None)
        if check is not None:
            check(rows)

    def sample(self, epoch: int, index: int, fetch_fn: Fn | None = None) -> Any:
        """fetch_fn (or the one given) then prep_fn on row `index`, with the sample in scope."""
        fetch_fn = fetch_fn or self.fetch_fn
        assert fetch_fn is not None  # a Recipe without one reads nothing by row
        with sample_scope(SampleKey(self.seed, epoch, index)):
            try:
                datum = fetch_fn(self.data, index)
                if self.prep_fn is None:
                    datum = self._returned("fetch_fn", datum)
                else:  # a prep_fn may turn any fetched value into the sample
                    datum = self._returned("prep_fn", self.prep_fn(datum))
                if self.finish_fn is None:
                    return datum
                return self.finish_fn(datum, self.source, index)
            except Exception as e:
                e.add_note(f"while preparing row {index} of epoch {epoch}")
                raise

    def columns(
        self, epoch: int, rows: np.ndarray, first: int, stacked: _Stacked | None
    ) -> tuple[dict[str, np.ndarray], Any]:
        """The gathered columns of `rows`, and the first value a checked cast lost.

        Into `stacked` from slot `first`, when given. The loss is a
        `dualtrain.fuel.gather.Lost`, or None.
        """
        if self.gather is None:
            return {}, None
        blocks = None if stacked is None else stacked.blocks(first, len(rows))
        try:
            columns, lost = self.gather(self.data, rows, blocks)
        except Exception as e:
            e.add_note(f"while reading {len(rows)} rows of epoch {epoch} from row {rows[0]}")
            raise
        return dict(columns), lost

    def report(self, epoch: int, lost: Any) -> None:
        """Raises the error a row-by-row read of the row `lost` names raises first."""
        if self.whole_row is not None:
            self.sample(epoch, lost.row, self.whole_row)  # raises, column after column
        try:
            lost.raise_()
        except Exception as e:
            e.add_note(f"while preparing row {lost.row} of epoch {epoch}")
            raise

    def _returned(self, name: str, value: Any) -> Any:
        if self.dict_samples and not isinstance(value, dict):
            raise ArgumentError(
                f"{name} must return a dict sample (key -> value) for the default collate; "
                f"{name} returned a {type(value).__name__}: return a dict, or pass collate_fn"
            )
        return value


class _Stacked:
    """The arrays a default-collated batch is stacked into.

    Each key's array is allocated by the first sample that reaches it; keys whose samples
    differ in shape or type become lists, except the `fixed` ones (pack columns of one
    shape), where that is a ShapeError naming `source`, the row and both kinds (a fixed
    key that every row returns as, say, a str still becomes a list).
    """

    def __init__(
        self, size: int, fixed: frozenset[str] = frozenset(), source: str = "prep_fn"
    ) -> None:
        self.size, self.fixed, self.source = size, fixed, source
        self.arrays: dict[str, np.ndarray] = {}
        self.ragged: set[str] = set()
        # Per fixed key, the first row's kind of value (shape and dtype, or a type) and row.
        self._kinds: dict[str, tuple[str, int | None]] = {}
        self._lock = threading.Lock()

    def put(self, slot: int, sample: dict[str, Any], row: int | None = None) -> None:
        for key, value in sample.items():
            if key in self.fixed:
                self._same_kind(key, value, row)
            if key in self.ragged:
                continue
            arr = self.arrays.get(key)
            if arr is None:
                if not isinstance(value, (np.ndarray, np.generic, int, float, bool)):
                    self.ragged.add(key)
                    continue
                value = np.asarray(value)
                with self._lock:
                    arr = self.arrays.get(key)
                    if arr is None:
                        arr = aligned_empty((self.size, *value.shape), value.dtype)
                        self.arrays[key] = arr
            if np.shape(value) != arr.shape[1:] or np.asarray(value).dtype != arr.dtype:
                self.ragged.add(key)
                continue
            arr[slot] = value

    def blocks(self, first: int, count: int) -> Callable[..., np.ndarray]:
        """``block(key, shape, dtype)``: slots [first, first + count) of key's array."""
        whole = first == 0 and count == self.size  # one part: the array itself, no view

        def block(key: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            arr = self.arrays.get(key)
            if arr is None:
                with self._lock:
                    arr = self.arrays.get(key)
                    if arr is None:
                        arr = aligned_empty((self.size, *shape[1:]), dtype)
                        self.arrays[key] = arr
            return arr if whole else arr[first : first + count]

        return block

    def _same_kind(self, key: str, value: Any, row: int | None) -> None:
        """Raises ShapeError unless `value` is of the kind the first row's was."""
        if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
            arr = np.asarray(value)
            kind = f"shape {arr.shape} {arr.dtype}"
        else:
            kind = f"a {type(value).__name__}"
        first = self._kinds.setdefault(key, (kind, row))  # atomic: dict.setdefault holds the GIL
        if first[0] != kind:
            raise ShapeError(
                f"{self.source} returned {kind} for {key!r} of row {row}; row {first[1]} "
                f"returned {first[0]}: the default collate stacks {key!r} (a pack column of "
                "one shape), so every row must return one shape and dtype; make them agree, "
                "or pass collate_fn"
            )


def _run_chunk(
    recipe: Recipe, epoch: int, rows: np.ndarray, first: int, stacked: _Stacked | None
) -> tuple[list[Any], dict[str, np.ndarray]]:
    """The samples of `rows` read row by row, and the columns gathered for all of them."""
    # The files are checked before the rows are read (a truncated file is an error, not a
    # SIGBUS of the mapping) and after (a file rewritten during the read is not served).
    recipe.check(rows)
    columns, lost = recipe.columns(epoch, rows, first, stacked)
    # Up to a row whose gathered cast lost a value: the errors come in row-by-row order.
    upto = len(rows) if lost is None else lost.position
    samples = [] if recipe.fetch_fn is None else [recipe.sample(epoch, int(i)) for i in rows[:upto]]
    if lost is not None:
        recipe.report(epoch, lost)
    recipe.check(rows)
    if stacked is not None:
        for offset, sample in enumerate(samples):
            stacked.put(first + offset, sample, int(rows[offset]))
    return samples, columns


def default_collate(
    samples: list[Any], stacked: _Stacked | None = None, recipe: Recipe | None = None,
    rows: Any = None,
) -> Any:  # fmt: skip
    """Stacks a list of dict samples key by key.

    Keys whose values differ in shape, or are not arrays or numbers (str, lists), stay lists
    (but for `recipe.fixed` keys, an error naming the row of `rows`).
    """
    if not samples or not isinstance(samples[0], dict):
        raise TypeError(
            f"the default collate takes dict samples; got {type(samples[0]).__name__}; "
            "pass collate_fn for other sample types"
        )
    if stacked is None:
        stacked = _Stacked(len(samples), *((recipe.fixed, recipe.source) if recipe else ()))
        for slot, sample in enumerate(samples):
            stacked.put(slot, sample, None if rows is None else int(rows[slot]))
    out: dict[str, Any] = {}
    for key in samples[0]:
        if key in stacked.ragged or key not in stacked.arrays:
            out[key] = [s[key] for s in samples]
        else:
            out[key] = stacked.arrays[key]
    return out


def _joined(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The gathered columns of a batch's parts (from worker processes), joined.

    Into 64-byte-aligned arrays, as the default collate makes them.
    """
    out = {}
    for key in parts[0]:
        pieces = [p[key] for p in parts]
        arr = aligned_empty((sum(len(p) for p in pieces), *pieces[0].shape[1:]), pieces[0].dtype)
        out[key] = np.concatenate(pieces, out=arr)
    return out


class Pipeline:
    """Prepares the batches of an order ahead of their use.

    Args:
        recipe: what to do per row.
        collate_fn: list of samples -> batch; None is `default_collate`, done in the workers.
        workers: 0 runs in the caller's thread; else the worker count.
        mode: "thread" or "process".
        prefetch: batches prepared ahead of the one being taken (with workers).
        lead: a preload cache's `dualtrain.fuel.preloading.Lead`: batches are planned (once
            each) until ``lead.rows`` rows, and ``lead(their rows)`` comes before any starts.
    """

    def __init__(
        self, recipe: Recipe, collate_fn: Fn | None, workers: int, mode: str, prefetch: int,
        lead: Lead | None = None,
    ) -> None:  # fmt: skip
        self.recipe, self.collate_fn = recipe, collate_fn
        self.workers, self.mode, self.prefetch, self.lead = workers, mode, prefetch, lead
        self._pool: Executor | None = None
        # [key, the key after it, its rows, the started batch or None], in serving order
        self._ahead: collections.deque[list[Any]] = collections.deque()

    def _executor(self) -> Executor:
        if self._pool is None:
            if self.mode == "thread":
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="dualtrain-tank")
            else:
                # spawn: the caller may hold torch or JAX threads, which fork copies half-alive.
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(self.workers, mp_context=context)
        return self._pool

    def _start(self, key: tuple[int, int], rows: np.ndarray) -> Any:
        """Starts one batch; returns what `_finish` needs."""
        epoch = key[0]
        in_workers = self.collate_fn is None and self.mode == "thread"
        stacked = _Stacked(len(rows), self.recipe.fixed, self.recipe.source) if in_workers else None
        if self.workers == 0:
            return key, rows, stacked, [_run_chunk(self.recipe, epoch, rows, 0, stacked)]
        # A batch read by gathers alone (no row-by-row work) is one task: split over
        # threads, its few NumPy calls would only contend for the GIL (64 rows: 250 µs in
        # two parts against 105 µs in one).
        parts = 1 if self.recipe.fetch_fn is None else min(self.workers, len(rows))
        bounds = np.linspace(0, len(rows), parts + 1).astype(int)
        pool = self._executor()
        futures = [
            pool.submit(_run_chunk, self.recipe, epoch, rows[lo:hi], int(lo), stacked)
            for lo, hi in itertools.pairwise(bounds)
        ]
        return key, rows, stacked, futures

    def _finish(self, started: Any) -> Any:
        key, rows, stacked, parts = started
        try:
            done = [part.result() if isinstance(part, Future) else part for part in parts]
        except BrokenProcessPool as e:
            # The pool is dead: every batch started on it is lost; the next call starts anew.
            self.close()
            listed = [int(r) for r in rows]
            raise TankWorkerError(
                f"a Tank worker process died while preparing batch {key[1]} of epoch {key[0]} "
                f"(rows {listed}): the likely cause is a fetch_fn or prep_fn that crashed "
                "the process (a segfault or os._exit in native code) or the system killing it "
                "for memory (see dmesg); the rows above are the ones in flight",
                key[0], key[1], listed,
            ) from e  # fmt: skip
        samples = [s for part_samples, _ in done for s in part_samples]
        if self.collate_fn is not None:
            return self.collate_fn(samples)
        if self.recipe.gather is None:
            return default_collate(samples, stacked, self.recipe, rows)
        by_row = default_collate(samples, stacked, self.recipe, rows) if samples else {}
        columns = stacked.arrays if stacked is not None else _joined([c for _, c in done])
        return {k: by_row[k] if k in by_row else columns[k] for k in self.recipe.keys}

    def get(self, key: tuple[int, int], plan: Callable[[tuple[int, int]], Any]) -> Any:
        """The batch `key` = (epoch, number); `plan(key)` gives its rows and the next key.

        Batches planned or prepared ahead for another order (after a seek) are dropped.
        """
        if self._ahead and self._ahead[0][0] != key:
            self.cancel()
        started = 1 + (self.prefetch if self.workers else 0)
        wanted = self.lead.rows if self.lead is not None else 0  # rows the cache plans
        planned = sum(len(entry[2]) for entry in self._ahead)
        while len(self._ahead) < started or planned < wanted:
            this = self._ahead[-1][1] if self._ahead else key
            rows, after = plan(this)
            self._ahead.append([this, after, rows, None])
            planned += len(rows)
        if self.lead is not None:
            self.lead([entry[2] for entry in self._ahead])
        for entry in itertools.islice(self._ahead, started):
            if entry[3] is None:
                entry[3] = self._start(entry[0], entry[2])
        return self._finish(self._ahead.popleft()[3])

    def cancel(self) -> None:
        """Drops the batches planned ahead (their work is waited for, then discarded)."""
        while self._ahead:
            started = self._ahead.popleft()[3]
            for part in started[3] if started is not None else ():
                if isinstance(part, Future):
                    part.cancel()

    def close(self) -> None:
        """Stops the workers."""
        self.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
