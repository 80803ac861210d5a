"""A Tank's preload option: its rows' fetched samples cached, loaded ahead in its order.

``Tank(..., preload=...)`` puts a `dualtrain.preload.PreloadCache` between the pack and
prep_fn: fetch_fn's output (the decoded row) is cached, prep_fn (a Comburant's random draws)
runs on a fresh copy every epoch, so the batches are exactly those served without it. The
Tank knows its order for every epoch, so the cache loads the rows of the batches after
the ones being prepared while the step runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.fuel.streams import no_sample_scope
from dualtrain.preload import PreloadCache

__all__ = ["cached_fetch", "preload_settings"]

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


class _Load:
    """``load(row)``: fetch_fn on the pack, where a per-sample random draw is an error."""

    def __init__(self, fetch_fn: Callable[[Any, int], Any], data: Any) -> None:
        self.fetch_fn, self.data = fetch_fn, data

    def __call__(self, row: int) -> Any:
        with no_sample_scope(_DRAW):
            return self.fetch_fn(self.data, row)


class _CachedFetch:
    """A fetch_fn serving rows from the cache (picklable: worker processes share it)."""

    def __init__(self, cache: PreloadCache) -> None:
        self.cache = cache

    def __call__(self, data: Any, index: int) -> Any:
        return self.cache.get(int(index))


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
