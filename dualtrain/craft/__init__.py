"""Craft: one model definition for torch and JAX, the dock layer set, and its NumPy reference."""

from __future__ import annotations

from typing import Any

from dualtrain.craft import dock
from dualtrain.craft.binding import NotRealizedError
from dualtrain.craft.craft import Craft
from dualtrain.craft.padding import autopad
from dualtrain.craft.params import ParamSpec
from dualtrain.craft.reference import reference_forward

__all__ = [
    "Craft",
    "NotRealizedError",
    "ParamSpec",
    "autopad",
    "dock",
    "reference_forward",
]

# Seed spellings served with a warning (dualtrain.deprecation.SEED_SPELLINGS).
_MOVED = ("autoPad",)


def __getattr__(name: str) -> Any:
    """Nebulae's ``autoPad``, moved to the compat namespace: here with a DeprecationWarning."""
    from dualtrain.deprecation import moved_attribute

    return moved_attribute(__name__, name, _MOVED)
