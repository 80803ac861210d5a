"""Nebulae v0.5.15 (github SeriaQ/Nebulae) on dualtrain: ``import dualtrain.compat.nebulae as neb``.

Each Nebulae package is a subpackage of the same name, so ``from nebulae.fuel import
depot`` becomes ``from dualtrain.compat.nebulae.fuel import depot``; ``neb.aerolog``,
``neb.cockpit`` and the rest load when first used. Nebulae v0.5 ran one framework a
process; its programs run here under torch (``astrobase.dock`` loads it). What follows
Nebulae's code where its documents differ, and what differs from Nebulae at all, is listed
in docs/migration.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["aerolog", "astro", "astrobase", "cockpit", "fuel", "kit", "law", "toolkit"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'dualtrain.compat.nebulae' has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{name}")
    globals()[name] = module
    return module


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
