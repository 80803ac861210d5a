"""The sample in hand, and the Fuel's random streams (which live in `dualtrain.random`).

Every random draw of the Fuel (an epoch's order, a sample's augmentation) comes from a
Philox stream named by what it is for (``dualtrain.random.stream``), so it does not depend
on which worker, thread, process or framework computes it, nor on what was drawn before.
`stream` and the purpose codes ORDER, AUGMENT, FILL and EMBED are re-exported here.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.random import AUGMENT, EMBED, FILL, ORDER, stream
from dualtrain.scoping import scoped

__all__ = [
    "AUGMENT",
    "EMBED",
    "FILL",
    "ORDER",
    "SampleKey",
    "current_sample",
    "no_sample_scope",
    "sample_scope",
    "stream",
]


@dataclasses.dataclass(frozen=True)
class SampleKey:
    """What names one sample's augmentation: the Tank's seed, the epoch, the row index."""

    seed: int
    epoch: int
    index: int


_current: contextvars.ContextVar[SampleKey | str | None] = contextvars.ContextVar(
    "dualtrain_fuel_sample", default=None
)


def current_sample() -> SampleKey | None:
    """The sample a Tank is preparing in this thread, or None outside a Tank.

    Raises:
        ArgumentError: inside `no_sample_scope` (a fetch whose output is cached), where a
            random draw would repeat every epoch.
    """
    current = _current.get()
    if isinstance(current, str):
        raise ArgumentError(current)
    return current


def no_sample_scope(reason: str) -> contextlib.AbstractContextManager[None]:
    """Code in this scope must not draw per sample: `current_sample` raises `reason`."""
    return scoped(_current, reason)


@contextlib.contextmanager
def sample_scope(key: SampleKey) -> Iterator[SampleKey]:
    """Marks `key` as the sample in hand while a Tank runs fetch_fn and prep_fn on it."""
    if key.epoch < 0 or key.index < 0:
        raise bad_argument("key", key, "a SampleKey with epoch >= 0 and index >= 0")
    with scoped(_current, key):
        yield key
