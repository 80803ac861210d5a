"""The samplers a Preloader makes: its own epoch order, and one that plans each epoch ahead.

`Preloader.sampler()` returns a `PlannedSampler`: it draws an epoch of the inner sampler
(the user's, or `EpochOrder`, the Preloader's own), tells the Preloader that order through
`expect`, then yields it unchanged, so the cache loads ahead exactly what comes next.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any, Protocol

from dualtrain.random import ORDER, stream

__all__ = ["EpochOrder", "Planned", "PlannedSampler"]


class Planned(Protocol):
    """What a `PlannedSampler` tells each epoch's order to: `Preloader.expect`."""

    def expect(self, indices: Iterable[Any]) -> None: ...


class EpochOrder:
    """Indices 0..n-1 each epoch, shuffled per (seed, epoch) when asked."""

    def __init__(self, n: int, shuffle: bool, seed: int) -> None:
        self.n, self.shuffle, self.seed, self.epoch = n, shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        if not self.shuffle:
            return iter(range(self.n))
        return iter(stream(self.seed, ORDER, epoch).permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class PlannedSampler:
    """A sampler that tells its Preloader each epoch's order before yielding it.

    Iterating draws the inner sampler's whole epoch (a list of its indices, or of index
    lists or 1-d index arrays for a batch sampler), gives the flattened order to
    `Preloader.expect`, then yields it unchanged. `len` and the inner sampler's attributes
    (``set_epoch``, ``batch_size``, ...) pass through; ``hasattr(s, "set_epoch")`` says
    whether the inner sampler has one, as trainers that call it check.
    """

    def __init__(self, preloader: Planned, sampler: Iterable[Any]) -> None:
        self.preloader, self.sampler = preloader, sampler

    def __iter__(self) -> Iterator[Any]:
        epoch = list(self.sampler)
        flat: list[Hashable] = []
        for entry in epoch:
            if isinstance(entry, (list, tuple)):
                flat.extend(entry)
            elif getattr(entry, "ndim", 0) == 1 and hasattr(entry, "tolist"):
                flat.extend(entry.tolist())  # a batch as a NumPy array or a tensor
            else:
                flat.append(entry)
        self.preloader.expect(flat)
        return iter(epoch)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("preloader", "sampler"):
            raise AttributeError(name)
        return getattr(self.sampler, name)
