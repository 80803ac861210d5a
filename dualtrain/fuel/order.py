"""The order a Tank serves rows in: per (seed, epoch), per rank, cut into batches.

One epoch: the rows 0..n-1, permuted by the (seed, epoch) stream when shuffling; rank r of
`world` takes every world-th row from position r. What happens to the end of the epoch is
the `last` mode:

- ``"fill"``: every rank takes n // world rows (the n % world left over rotate with the
  permutation, so every row is served over epochs); the last batch is filled with rows drawn
  by the seed from the rest of the share, so every batch has `batch_size` rows.
- ``"short"``: the same shares; the last batch is short.
- ``"drop"``: the same shares; the incomplete last batch is left out.
- ``"pad"``: rank r takes all of rows r, r + world, ... (so the ranks together take every
  row once); every rank serves ceil(ceil(n / world) / batch_size) batches, the last ones
  padded to `batch_size` with repeats of the rank's rows that `valid` marks as padding.
"""

from __future__ import annotations

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.fuel.streams import FILL, ORDER, stream

__all__ = ["LAST_MODES", "EpochOrder"]

LAST_MODES = ("fill", "short", "drop", "pad")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


class EpochOrder:
    """Row order of every epoch for one rank.

    Args:
        n: rows in the pack.
        batch_size: rows per batch.
        shuffle: permute each epoch; else rows in pack order.
        full: every batch full (the last one filled); else a short last batch. `last`,
            when given, replaces it.
        seed: the shuffling seed.
        rank, world: this rank and the number of ranks.
        last: "fill", "short", "drop" or "pad" (see the module's docstring).
    """

    def __init__(
        self, n: int, batch_size: int, *, shuffle: bool, full: bool = True, seed: int,
        rank: int, world: int, last: str | None = None,
    ) -> None:  # fmt: skip
        if not _is_int(world) or world < 1:
            raise bad_argument("world", world, "a positive int")
        if not _is_int(rank) or not 0 <= rank < world:
            raise bad_argument("rank", rank, f"an int in [0, world={world})")
        if last is None:
            last = "fill" if full else "short"
        if last not in LAST_MODES:
            raise bad_argument("last", last, f"one of {LAST_MODES}")
        if n // world < 1:
            raise bad_argument("world", world, f"at most the pack's {n} rows")
        rank, world = int(rank), int(world)
        self.n, self.batch_size, self.shuffle, self.last = n, batch_size, shuffle, last
        self.full = last in ("fill", "pad")
        self.seed, self.rank, self.world = seed, rank, world
        if last == "pad":
            self.share = len(range(rank, n, world))
            most = -(-n // world)  # the largest share: every rank serves its batch count
            self.batches = -(-most // batch_size)
        else:
            self.share = n // world
            whole = self.share // batch_size
            self.batches = whole if last == "drop" else -(-self.share // batch_size)
        if self.batches < 1:
            raise bad_argument(
                "batch_size", batch_size, f"at most the {self.share} rows of a rank's epoch "
                "with drop_last (else no batch is served)"
            )  # fmt: skip
        self._cache: tuple[int, np.ndarray] | None = None

    @property
    def rows_per_epoch(self) -> int:
        """Distinct rows this rank serves in one epoch (fill and padding not counted)."""
        return self.batches * self.batch_size if self.last == "drop" else self.share

    @property
    def samples_per_epoch(self) -> int:
        """Samples this rank serves in one epoch, fill and padding included."""
        return self.share if self.last == "short" else self.batches * self.batch_size

    def epoch(self, epoch: int) -> np.ndarray:
        """This rank's rows of `epoch`, in order, filled or padded to whole batches."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        if self.shuffle:
            rows = stream(self.seed, ORDER, epoch).permutation(self.n)
        else:
            rows = np.arange(self.n)
        mine = rows[self.rank :: self.world][: self.share]
        missing = self.batches * self.batch_size - self.share
        if self.last == "drop":
            mine = mine[: self.batches * self.batch_size]
        elif self.last == "pad" and missing:
            mine = np.concatenate([mine, np.resize(mine, missing)])
        elif self.last == "fill" and missing:
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

    def valid(self, number: int) -> np.ndarray:
        """Which rows of batch `number` are real (False: padding; always True but in "pad")."""
        size = self.batch_size
        if self.last == "short":
            size = min(size, self.share - number * self.batch_size)
        real = self.share - number * self.batch_size if self.last == "pad" else size
        return np.arange(size) < real
