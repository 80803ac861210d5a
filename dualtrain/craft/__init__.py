"""Craft: one model definition for torch and JAX, the dock layer set, and its NumPy reference."""

from __future__ import annotations

from dualtrain.craft import dock
from dualtrain.craft.binding import NotRealizedError
from dualtrain.craft.craft import Craft
from dualtrain.craft.padding import autoPad, autopad
from dualtrain.craft.params import ParamSpec
from dualtrain.craft.reference import reference_forward

__all__ = [
    "Craft",
    "NotRealizedError",
    "ParamSpec",
    "autoPad",
    "autopad",
    "dock",
    "reference_forward",
]
