"""Craft: one model definition for torch and JAX, the dock layer set, and its NumPy reference."""

from __future__ import annotations

from dualtrain.craft import dock
from dualtrain.craft.binding import NotRealizedError
from dualtrain.craft.craft import Craft
from dualtrain.craft.padding import autopad
from dualtrain.craft.params import ParamSpec
from dualtrain.craft.reference import reference_forward
from dualtrain.deprecation import seed_spellings

__all__ = [
    "Craft",
    "NotRealizedError",
    "ParamSpec",
    "autopad",
    "dock",
    "reference_forward",
]

# Seed spellings served with a warning (dualtrain.deprecation.SEED_SPELLINGS).
__getattr__ = seed_spellings(__name__, ("autoPad",))
