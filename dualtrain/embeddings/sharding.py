"""A store's rows split across the processes of a run, and a batch's trip to their owners.

``mv.sync(store)`` makes a store one process's shard: the table's ids are cut into `world`
contiguous ranges (`split`: the first ``num_rows % world`` ranges hold one row more), and a
process allocates and trains only its own range. A batch then travels in three all-to-all
exchanges over the run's engine (torch.distributed's gloo collectives; JAX's multi-process
runtime), each of them a collective every process enters in the same order:

1. `route`: every process's lengths are shared (one small collective), then each process
   sends the ids it needs to their owners. An owner takes the union of what it was asked
   (its rows the whole run touches this step).
2. `serve`: each owner sends those rows back; every process now has its batch's rows.
3. `collect`: after backward, each process sends its gradient of every row back to the
   row's owner, which adds up the gradients from all processes per row (TorchRec's rule:
   what one process stepping the union of the batches with the sum of their losses does)
   and steps each row once.

The adapter's ordinary attachment trains the owner's rows (``local``), so every optimizer,
both modes, the staging and the thread rules are those of an unsharded store.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Protocol, runtime_checkable

import numpy as np

from dualtrain.embeddings.ids import Lookup
from dualtrain.errors import ArgumentError, bad_argument

__all__ = ["Counts", "Exchange", "Route", "Shard", "Traffic", "Wire", "split"]

_COUNTING = threading.Lock()


def split(num_rows: int, world: int) -> np.ndarray:
    """Where each process's range starts: int64 [world + 1], ``bounds[r]:bounds[r + 1]``.

    Contiguous and as even as can be: the first ``num_rows % world`` ranges hold one more.
    """
    if world < 1:
        raise bad_argument("world", world, "a positive number of processes")
    base, extra = divmod(num_rows, world)
    sizes = np.full(world, base, np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


@runtime_checkable
class Exchange(Protocol):
    """An all-to-all over a run's processes (the adapter's, on its framework's engine).

    Attributes:
        rank: this process's rank.
        world: processes in the run.
    """

    rank: int
    world: int

    @property
    def ahead(self) -> Exchange | None:
        """A second exchange on a channel of its own, or None.

        A second thread may use it while this one's exchanges run (prefetches route on
        it); None where every exchange must come from one thread.
        """
        ...

    def lengths(self, sent: list[int], /) -> np.ndarray:
        """Every rank's list of ints (a collective): int64 [world, len(sent)].

        Row i is rank i's `sent` (the lengths of its parts, by destination, and whatever
        else the caller appends); every rank passes as many.
        """
        ...

    def all_to_all(
        self, parts: list[np.ndarray], /, counts: Counts | None = None
    ) -> list[np.ndarray]:
        """Sends ``parts[j]`` to rank j; returns what each rank sent here, by rank.

        Every part has the same dtype and trailing shape on every rank; lengths differ.
        `counts`, when the caller knows them (from `lengths`): an exchange may then skip
        sharing the lengths itself.
        """
        ...


@dataclasses.dataclass(frozen=True)
class Counts:
    """What one all-to-all brings here, where the caller knows it (from `Exchange.lengths`).

    Attributes:
        receive: the rows each rank sends here, by rank.
        most: the longest part any rank sends in this exchange (or a bound on it): what an
            exchange that pads its parts pads to.
    """

    receive: tuple[int, ...]
    most: int

    @classmethod
    def of(cls, every: np.ndarray, rank: int) -> Counts:
        """`rank`'s counts from every rank's part lengths by destination, [world, world]."""
        return cls(tuple(every[:, rank].tolist()), int(every.max()))


@dataclasses.dataclass(frozen=True)
class Wire:
    """Rows as an engine's all-to-all moves them: each row its bytes, uint8 [n, width].

    Any dtype travels so (bfloat16 included, which no engine need know), and parts of one
    width in bytes share whatever an engine compiles for them.

    Attributes:
        dtype: the rows' dtype.
        trail: a row's shape (a part's shape past its first axis).
        width: bytes a row.
    """

    dtype: np.dtype
    trail: tuple[int, ...]
    width: int

    @classmethod
    def of(cls, parts: list[np.ndarray]) -> Wire:
        """The layout of `parts`, read from the first (every part has its dtype and trail)."""
        first = parts[0]
        trail = tuple(first.shape[1:])
        return cls(first.dtype, trail, first.dtype.itemsize * math.prod(trail))

    def pack(self, part: np.ndarray) -> np.ndarray:
        """`part`'s rows as bytes: uint8 [len(part), width] (a view where `part` is contiguous)."""
        return np.ascontiguousarray(part).view(np.uint8).reshape(len(part), self.width)

    def unpack(self, data: np.ndarray) -> np.ndarray:
        """The rows whose bytes `data` holds (uint8 [n, width]): [n, *trail], a view."""
        # By its row count: a row of no bytes (a 0 in `trail`) leaves -1 undetermined.
        return data.view(self.dtype).reshape(len(data), *self.trail)


@dataclasses.dataclass(frozen=True)
class Route:
    """One batch's trip: what this process asked of whom, and what it was asked.

    Attributes:
        lookup: this process's ids: their sorted unique rows [U] and inverse.
        cuts: int64 [world + 1]; ``lookup.unique[cuts[j]:cuts[j + 1]]`` are rank j's rows.
        most: the most rows any process asked of any one process (its rows and gradients
            travel in parts of at most this many).
        union: sorted unique rows the run asked of this process, as local indices [M].
        asked: per requesting rank, how many rows it asked of this process.
        back: per row asked (requesters in rank order), its position in `union` [sum(asked)].
    """

    lookup: Lookup
    cuts: np.ndarray
    most: int
    union: np.ndarray
    asked: list[int]
    back: np.ndarray


def _check_refusals(flags: np.ndarray, refused: BaseException | None) -> None:
    """Raises on every process when one of them flagged -1 (this one: its own `refused`)."""
    if refused is not None:
        raise refused
    failed = np.flatnonzero(flags == -1).tolist()
    if failed:
        raise ArgumentError(
            f"rank(s) {failed} refused this batch of the sharded store (their ids; see their "
            "error): every process stops it, as none may wait in an exchange the others skip"
        )


@dataclasses.dataclass
class Traffic:
    """What a shard's exchanges moved, from this process's side.

    Attributes:
        calls: all-to-all exchanges: three a trained batch (ids, rows, gradients).
        sent: bytes this process sent to others: ids, rows and gradients (lengths and
            padding excluded).
        received: bytes it received.
        seconds: wall time inside the exchanges, waiting for slower peers included.
    """

    calls: int = 0
    sent: int = 0
    received: int = 0
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Shard:
    """This process's part of a sharded store, and the exchange that joins the parts.

    Attributes:
        rank: this process's rank.
        world: processes the table is split over.
        bounds: int64 [world + 1] from `split`.
        exchange: the run's all-to-all.
        traffic: what its exchanges moved so far.
    """

    rank: int
    world: int
    bounds: np.ndarray
    exchange: Exchange
    traffic: Traffic = dataclasses.field(default_factory=Traffic)

    def swap(
        self,
        parts: list[np.ndarray],
        channel: Exchange | None = None,
        counts: Counts | None = None,
    ) -> list[np.ndarray]:
        """One all-to-all (a collective) on `channel` (default `exchange`), counted.

        `counts`: what arrives, when the route already says (`Exchange.all_to_all`).
        """
        start = time.perf_counter()
        received = (channel or self.exchange).all_to_all(parts, counts)
        seconds = time.perf_counter() - start
        sent = sum(p.nbytes for j, p in enumerate(parts) if j != self.rank)
        got = sum(p.nbytes for j, p in enumerate(received) if j != self.rank)
        with _COUNTING:  # a prefetch's route counts from its own thread
            traffic = self.traffic
            traffic.seconds += seconds
            traffic.calls += 1
            traffic.sent += sent
            traffic.received += got
        return received

    @property
    def rows(self) -> range:
        """The ids this process owns."""
        return range(int(self.bounds[self.rank]), int(self.bounds[self.rank + 1]))

    def owner(self, ids: np.ndarray) -> np.ndarray:
        """The rank that owns each id (int64, the shape of `ids`)."""
        return np.searchsorted(self.bounds, ids, side="right").astype(np.int64) - 1

    def agree(self, flag: int, refused: BaseException | None = None) -> np.ndarray:
        """Every process's `flag` (a collective); raises everywhere if one was `refused`.

        `refused`: this process's error (its ids, say), which it raises after telling the
        others; they raise an ArgumentError naming it. No process is then left waiting in
        a collective its peer never enters.
        """
        every = self.exchange.lengths([-1 if refused is not None else flag])[:, 0]
        _check_refusals(every, refused)
        return every

    def route(
        self,
        found: Lookup | None,
        channel: Exchange | None = None,
        refused: BaseException | None = None,
    ) -> Route:
        """Exchange 1 (a collective): tells each owner which of its rows this batch needs.

        Args:
            found: the batch's ids (None with `refused`).
            channel: the exchange to use (a prefetch's own), default `exchange`.
            refused: this process's error making the batch: the others learn of it in the
                lengths' exchange and every process raises (see `agree`).
        """
        unique = found.unique if found is not None else np.zeros(0, np.int64)
        inner = np.searchsorted(unique, self.bounds[1:-1], side="left")
        cuts = np.concatenate([[0], inner, [unique.size]]).astype(np.int64)
        parts = [unique[cuts[j] : cuts[j + 1]] for j in range(self.world)]
        # Every process's lengths, once a batch: its three exchanges then need no more. The
        # last column says whether the process could make its batch.
        status = -1 if refused is not None else 0
        every = (channel or self.exchange).lengths([*(len(p) for p in parts), status])
        _check_refusals(every[:, -1], refused)
        every = every[:, :-1]
        assert found is not None
        counts = Counts.of(every, self.rank)
        asked_of_me = self.swap(parts, channel, counts)
        requested = np.concatenate(asked_of_me) if asked_of_me else np.zeros(0, np.int64)
        union, back = np.unique(requested - self.rows.start, return_inverse=True)
        return Route(
            found,
            cuts,
            counts.most,
            union.astype(np.int64, copy=False),
            [len(a) for a in asked_of_me],
            back.astype(np.int64, copy=False).reshape(-1),
        )

    def serve(self, route: Route, rows: np.ndarray) -> np.ndarray:
        """Exchange 2 (a collective): `rows` ([M, dim], `route.union`'s) to who asked.

        Returns:
            This process's batch rows [U, dim], in the order of ``route.lookup.unique``.
        """
        picked = rows[route.back]
        ends = np.cumsum(route.asked)[:-1]
        owed = tuple(np.diff(route.cuts).tolist())  # what each owner sends here: what was asked
        received = self.swap(np.split(picked, ends), counts=Counts(owed, route.most))
        return np.concatenate(received) if received else picked[:0]

    def collect(self, route: Route, grad: np.ndarray) -> np.ndarray:
        """Exchange 3 (a collective): each row's gradients, summed over the processes.

        Args:
            route: the batch's route.
            grad: this process's gradient of its batch rows, [U, dim] in `route.lookup`'s
                unique order (repeated ids already added up).

        Returns:
            The summed gradient of every row in `route.union`, [M, dim]: float32 for a
            float16 or bfloat16 `grad` (rounded once, by the optimizer's cast), else in
            `grad`'s dtype.
        """
        parts = [grad[route.cuts[j] : route.cuts[j + 1]] for j in range(self.world)]
        received = self.swap(parts, counts=Counts(tuple(route.asked), route.most))
        total = np.zeros((route.union.size, *grad.shape[1:]), np.result_type(grad, np.float32))
        start = 0
        for part in received:
            # A requester asks for a row once, so within a part no position repeats: a plain
            # fancy-indexed add is exact here (and several times faster than np.add.at).
            total[route.back[start : start + len(part)]] += part
            start += len(part)
        return total
