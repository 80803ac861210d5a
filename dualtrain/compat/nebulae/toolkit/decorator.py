"""Nebulae's ``nebulae.toolkit.Timer``."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from dualtrain.errors import bad_argument

__all__ = ["Timer"]


def Timer(func: Callable[..., Any]) -> Callable[..., tuple[Any, ...]]:  # noqa: N802 - Nebulae's
    """``@Timer``: the call returns ``(seconds, *results)`` (a single result as one element).

    Seconds are wall-clock (``time.perf_counter``) around the call; Nebulae used time.time.
    """
    if not callable(func):
        raise bad_argument("func", func, "a function to time")

    @functools.wraps(func)
    def timed(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        start = time.perf_counter()
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - start
        return (seconds, *(out if isinstance(out, tuple) else (out,)))

    return timed
