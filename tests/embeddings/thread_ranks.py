"""Several "ranks" of a sharded store as threads of one process: an in-process `Exchange`.

`run_ranks(world, fn)` runs ``fn(rank, exchange)`` on `world` threads whose exchange is a
real all-to-all between them (a `threading.Barrier` and a shared board): sharded writes and
reads at world sizes 1..4 without spawning processes. A thread that raises breaks the
barrier (after a grace period), so the others fail instead of waiting for good;
`run_ranks` returns every rank's result or exception.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dualtrain.embeddings.sharding import Counts

TIMEOUT = 60.0
GRACE = 2.0  # seconds the other ranks get to leave an exchange after one rank failed


class Board:
    """What the ranks post for each other: one all-to-all at a time."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=TIMEOUT)
        self.posted: list[list[np.ndarray] | None] = [None] * world


class ThreadExchange:
    """`dualtrain.embeddings.Exchange` between the threads of one `Board`.

    Args:
        rank: this thread's rank.
        board: the board every rank shares.
        die_after: with a number n, the process exits (``os._exit(9)``, like a kill) as the
            n-th all-to-all returns: for tests of a write cut short in a child process.
    """

    def __init__(
        self,
        rank: int,
        board: Board,
        die_after: int | None = None,
        ahead: ThreadExchange | None = None,
    ) -> None:
        self.rank, self.world, self.board = rank, board.world, board
        self.calls, self.die_after = 0, die_after
        self.ahead = ahead  # a second exchange on a board of its own (prefetch routes)

    def lengths(self, sent: list[int], /) -> np.ndarray:
        """Every rank's part lengths [world, world] (an exchange of the lengths)."""
        got = self.all_to_all([np.array([sent]) for _ in range(self.world)])
        return np.concatenate(got).astype(np.int64)

    def all_to_all(
        self, parts: list[np.ndarray], /, counts: Counts | None = None
    ) -> list[np.ndarray]:
        """Sends ``parts[j]`` to rank j; returns what each rank sent here, by rank.

        `counts`, when given, must say what arrives (checked: the engines' exchanges trust
        it).
        """
        assert len(parts) == self.world
        board = self.board
        board.posted[self.rank] = [np.array(p, copy=True) for p in parts]
        board.barrier.wait()
        got = [board.posted[j][self.rank] for j in range(self.world)]  # type: ignore[index]
        board.barrier.wait()  # every rank has read before the board is used again
        if counts is not None:
            assert [len(g) for g in got] == list(counts.receive), (counts, [len(g) for g in got])
            assert max(len(p) for p in parts) <= counts.most, (counts, [len(p) for p in parts])
        self.calls += 1
        if self.die_after is not None and self.calls >= self.die_after:
            os._exit(9)
        return got


def run_ranks(
    world: int,
    fn: Callable[[int, ThreadExchange], Any],
    die_after: int | None = None,
    ahead: bool = False,
) -> list[Any]:
    """``fn(rank, exchange)`` on `world` threads; each rank's result, or its exception.

    With `ahead`, each exchange has a second one on a board of its own (``exchange.ahead``),
    as torch's has a second gloo group.
    """
    board = Board(world)
    second = Board(world) if ahead else None
    out: list[Any] = [None] * world

    failed = threading.Event()

    def one(rank: int) -> None:
        try:
            extra = ThreadExchange(rank, second) if second is not None else None
            out[rank] = fn(rank, ThreadExchange(rank, board, die_after, extra))
        except BaseException as err:  # reported to the test
            out[rank] = err
            failed.set()

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    # A rank that failed may have left the others waiting for it in an exchange: they are
    # released (BrokenBarrierError) after a grace period, not at once, since a rank that
    # raises just after an exchange must not break the others' way out of that exchange.
    deadline = time.monotonic() + TIMEOUT * 4
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        if failed.wait(0.05):
            for t in threads:
                t.join(GRACE)
            board.barrier.abort()
            if second is not None:
                second.barrier.abort()
    for t in threads:
        t.join(TIMEOUT)
    return out


def unwrap(results: list[Any]) -> list[Any]:
    """The results, raising the first rank's own exception if any rank failed (not the
    broken barrier the others then see)."""
    errors = [r for r in results if isinstance(r, BaseException)]
    own = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if own or errors:
        raise (own or errors)[0]
    return results
