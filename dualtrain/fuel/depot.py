"""Deprecated: Nebulae's ``depot`` moved to `dualtrain.compat.nebulae.fuel.depot`.

Importing this module warns (DeprecationWarning) and still gives dualtrain's own Tank,
Comburant and transforms under the old spelling, for one release. New code imports them
from `dualtrain.fuel`; Nebulae's programs import Nebulae's from the compat namespace.
"""

from __future__ import annotations

from dualtrain.deprecation import moved
from dualtrain.fuel.comburant import Comburant
from dualtrain.fuel.tank import Tank
from dualtrain.fuel.transforms import Brighten, Contrast, Crop, Flip, Rotate, Sampling, Saturate

__all__ = [
    "Brighten", "Comburant", "Contrast", "Crop", "Flip", "Rotate", "Sampling", "Saturate", "Tank",
]  # fmt: skip

moved(
    "dualtrain.fuel.depot",
    "dualtrain.fuel's own names (Tank, Comburant, ...), or dualtrain.compat.nebulae.fuel.depot "
    "(Nebulae's)",
    stacklevel=3,  # moved -> this module -> the importer (outside importlib's frames)
)
