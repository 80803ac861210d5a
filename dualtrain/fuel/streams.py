"""Counter-based random streams keyed by (seed, epoch, index), and the sample in hand.

Every random draw of the Fuel (an epoch's order, a sample's augmentation) comes from a
Philox stream named by what it is for, so it does not depend on which worker, thread,
process or framework computes it, nor on what was drawn before.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["SampleKey", "current_sample", "sample_scope", "stream"]

_MASK = (1 << 64) - 1
ORDER, AUGMENT, FILL, EMBED = 1, 2, 3, 4  # what a stream is for: the key's upper word


def stream(seed: int, purpose: int, *counter: int) -> np.random.Generator:
    """A generator for (seed, purpose, counter...): independent of every other such tuple.

    Args:
        seed: any int (taken modulo 2**64).
        purpose: ORDER, AUGMENT, FILL or EMBED (embedding-table initialization).
        counter: up to three non-negative ints (epoch, sample index, transform position).
    """
    words = [0, *counter, 0, 0, 0][:4]  # the first word is Philox's own draw counter
    return np.random.Generator(
        np.random.Philox(counter=words, key=(seed & _MASK) | (purpose << 64))
    )


@dataclasses.dataclass(frozen=True)
class SampleKey:
    """What names one sample's augmentation: the Tank's seed, the epoch, the row index."""

    seed: int
    epoch: int
    index: int


_current: contextvars.ContextVar[SampleKey | None] = contextvars.ContextVar(
    "dualtrain_fuel_sample", default=None
)


def current_sample() -> SampleKey | None:
    """The sample a Tank is preparing in this thread, or None outside a Tank."""
    return _current.get()


@contextlib.contextmanager
def sample_scope(key: SampleKey) -> Iterator[SampleKey]:
    """Marks `key` as the sample in hand while a Tank runs fetch_fn and prep_fn on it."""
    if key.epoch < 0 or key.index < 0:
        raise bad_argument("key", key, "a SampleKey with epoch >= 0 and index >= 0")
    token = _current.set(key)
    try:
        yield key
    finally:
        _current.reset(token)
