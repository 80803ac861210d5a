"""The order a Tank serves rows in: per (seed, epoch), per rank, cut into batches.

One epoch: the rows 0..n-1, permuted by the (seed, epoch) stream when shuffling; rank r of
`world` takes every world-th row from position r, so ranks are disjoint and equal in size
(the n % world rows left over rotate with the permutation, so every row is served over
epochs). The rank's share is cut into batches; with ``full=True`` the last batch is filled
with rows drawn by the seed from the rest of the share, so every batch has `batch_size` rows.
"""

from __future__ import annotations

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.fuel.streams import FILL, ORDER, stream

__all__ = ["EpochOrder"]


class EpochOrder:
    """Row order of every epoch for one rank.

    Args:
        n: rows in the pack.
        batch_size: rows per batch.
        shuffle: permute each epoch; else rows in pack order.
        full: every batch full (the last one filled); else a short last batch.
        seed: the shuffling seed.
        rank, world: this rank and the number of ranks.
    """

    def __init__(
        self, n: int, batch_size: int, *, shuffle: bool, full: bool, seed: int, rank: int,
        world: int,
    ) -> None:  # fmt: skip
        if not isinstance(world, int) or world < 1:
            raise bad_argument("world", world, "a positive int")
        if not isinstance(rank, int) or not 0 <= rank < world:
            raise bad_argument("rank", rank, f"an int in [0, world={world})")
        if n // world < 1:
            raise bad_argument("world", world, f"at most the pack's {n} rows")
        self.n, self.batch_size, self.shuffle, self.full = n, batch_size, shuffle, full
        self.seed, self.rank, self.world = seed, rank, world
        self.share = n // world
        self.batches = -(-self.share // batch_size)  # ceil
        self._cache: tuple[int, np.ndarray] | None = None

    def epoch(self, epoch: int) -> np.ndarray:
        """This rank's rows of `epoch`, in order, filled to whole batches when `full`."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        if self.shuffle:
            rows = stream(self.seed, ORDER, epoch).permutation(self.n)
        else:
            rows = np.arange(self.n)
        mine = rows[self.rank :: self.world][: self.share]
        missing = self.batches * self.batch_size - self.share
        if self.full and missing:
            mine = np.concatenate([mine, self._fill(mine, missing, epoch)])
        self._cache = (epoch, mine)
        return mine

    def _fill(self, mine: np.ndarray, missing: int, epoch: int) -> np.ndarray:
        # Draw from the rows not already in the last batch, so a batch repeats no row
        # (unless the whole share is smaller than one batch).
        last = self.share - (self.batch_size - missing)
        pool = mine[:last] if last > 0 else mine
        rng = stream(self.seed, FILL, epoch, self.rank)
        if missing <= pool.size:
            return rng.choice(pool, size=missing, replace=False)
        return rng.choice(pool, size=missing, replace=True)

    def batch(self, epoch: int, number: int) -> np.ndarray:
        """The rows of batch `number` of `epoch` (int64)."""
        rows = self.epoch(epoch)
        return rows[number * self.batch_size : (number + 1) * self.batch_size]
