"""A Tank's preload option: its rows' fetched samples cached, loaded ahead in its order.

``Tank(..., preload=...)`` puts a `dualtrain.preload.PreloadCache` between the pack and
prep_fn: fetch_fn's output (the decoded row) is cached, prep_fn (a Comburant's random draws)
runs on a fresh copy every epoch, so the batches are exactly those served without it. The
Tank knows its order for every epoch, so the cache loads the rows of the coming batches
while the step runs. Rows are keyed with the identity of the pack's files, so a pack
replaced on disk and read again after ``close`` never gets the old rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.fuel.pack import Pack
from dualtrain.fuel.streams import no_sample_scope
from dualtrain.preload import PreloadCache

__all__ = ["Lead", "RowKey", "cached_fetch", "preload_settings", "row_key"]

RowKey = tuple[int, Any]  # (row, the identities of the pack's files)

_KEYS = ("max_memory_size", "preloaded_data", "threads", "copy", "sizeof")
_DRAW = (
    "a Tank with preload caches fetch_fn's output, so a random draw there would repeat "
    "every epoch: draw in prep_fn (a Comburant belongs there)"
)


def preload_settings(preload: object) -> dict[str, Any] | None:
    """The cache's keywords for `preload` (None: no cache).

    False or None: no cache; True: the defaults; an int: the budget in bytes; a mapping:
    `PreloadCache` keywords.
    """
    if preload is None or preload is False:
        return None
    if preload is True:
        return {}
    if isinstance(preload, np.integer):
        preload = int(preload)
    if isinstance(preload, int) and not isinstance(preload, bool):
        if preload < 0:
            raise bad_argument("preload", preload, "a budget in bytes >= 0")
        return {"max_memory_size": preload}
    if isinstance(preload, Mapping):
        unknown = sorted(set(preload) - set(_KEYS))
        if unknown:
            raise bad_argument("preload", dict(preload), f"keys among {_KEYS}; got {unknown}")
        settings = dict(preload)
        # The values checked now, by the cache itself, before the Tank opens anything; the
        # error names `preload`, the argument the caller gave.
        try:
            PreloadCache(_no_load, shareable=False, **settings).close()
        except ArgumentError as e:
            raise bad_argument("preload", settings, f"valid preload settings ({e})") from None
        return settings
    raise bad_argument(
        "preload", preload, "False, True, a budget in bytes, or a dict of preload settings"
    )


def _no_load(key: Any) -> None:
    """The loader of the throwaway cache that checks the settings (never called)."""


def row_key(pack: Pack, row: int) -> RowKey:
    """The cache key of `row`: the row and the identity of the pack's files.

    A pack replaced on disk and read again after `Tank.close` has other identities, so its
    rows are other keys: the old decoded rows are never served for it.
    """
    return (int(row), pack.generation)


class _Load:
    """``load(key)``: fetch_fn on the pack, where a per-sample random draw is an error."""

    def __init__(self, fetch_fn: Callable[[Any, int], Any], data: Any) -> None:
        self.fetch_fn, self.data = fetch_fn, data

    def __call__(self, key: RowKey) -> Any:
        with no_sample_scope(_DRAW):
            return self.fetch_fn(self.data, key[0])


class _CachedFetch:
    """A fetch_fn serving rows from the cache (picklable: worker processes share it).

    Dict samples come back as a new dict (shallow), so prep_fn and the Tank's own layout and
    scale steps, which set keys of the sample, never change the held one, even with
    ``copy=False``.
    """

    def __init__(self, cache: PreloadCache) -> None:
        self.cache = cache
        self.generation: Any = None

    def __call__(self, data: Pack, index: int) -> Any:
        key = row_key(data, index)
        if key[1] != self.generation:
            if self.generation is not None:  # the files changed: drop the old rows
                self.cache.clear()
            self.generation = key[1]
        sample = self.cache.get(key)
        return dict(sample) if type(sample) is dict else sample


class Lead:
    """``lead(batches)``: the first `rows` rows the Tank's pipeline planned become the plan.

    The one look-ahead of a preloading Tank: the pipeline plans each batch once, and the
    cache's threads load the rows of what it planned, which its workers then take.
    The rows of the batches being prepared come first, so the window protects them until
    they are served (planned after them, they would be the first evicted).
    """

    def __init__(self, cache: PreloadCache, pack: Pack) -> None:
        self.cache, self.pack = cache, pack
        self.rows = cache.preloaded_data

    def __call__(self, batches: Iterable[np.ndarray]) -> None:
        rows = itertools.islice(itertools.chain.from_iterable(batches), self.rows)
        generation = self.pack.generation  # `row_key`'s, looked up once for the plan
        self.cache.expect([(int(row), generation) for row in rows])


def cached_fetch(
    settings: dict[str, Any],
    fetch_fn: Callable[[Any, int], Any],
    data: Any,
    processes: bool,
    window: int,
) -> tuple[PreloadCache, Callable[[Any, int], Any]]:
    """The cache and the fetch_fn that reads through it.

    `window` is the default of ``preloaded_data`` (rows loaded ahead): the Tank passes the
    rows of the batches its pipeline prepares plus one more batch. With worker processes
    the cache is shared through memory and the Tank's own process loads nothing ahead (the
    workers, not it, would use what it loads).
    """
    settings = {"preloaded_data": window, **settings}
    if processes:
        settings = {**settings, "threads": 0}
    cache = PreloadCache(_Load(fetch_fn, data), shareable=processes, **settings)
    return cache, _CachedFetch(cache)
