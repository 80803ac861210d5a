"""The brochure's ``nebulae.astro``: the same package as ``astrobase``."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["dock", "hangar"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"dualtrain.compat.nebulae.astrobase.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
