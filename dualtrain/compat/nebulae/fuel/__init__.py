"""Nebulae's ``nebulae.fuel``: ``Generator`` (dualtrain's FuelGenerator) and ``depot``."""

from __future__ import annotations

import importlib
from typing import Any

from dualtrain.compat.nebulae.fuel.generator import Generator

__all__ = ["Generator", "depot"]


def __getattr__(name: str) -> Any:
    if name == "depot":
        return importlib.import_module(f"{__name__}.depot")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
