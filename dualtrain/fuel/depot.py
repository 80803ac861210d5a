"""Nebulae's spelling ``from nebulae.fuel import depot``: the Tank, Comburant and transforms.

The brochure's examples import ``depot`` and call ``depot.Tank(...)`` and
``depot.Comburant(...)``; with ``from dualtrain.fuel import depot`` they run unchanged.
New code imports the names from `dualtrain.fuel` (or `dualtrain`) directly.
"""

from __future__ import annotations

from dualtrain.fuel.comburant import Comburant
from dualtrain.fuel.tank import Tank
from dualtrain.fuel.transforms import Brighten, Contrast, Crop, Flip, Rotate, Sampling, Saturate

__all__ = [
    "Brighten", "Comburant", "Contrast", "Crop", "Flip", "Rotate", "Sampling", "Saturate", "Tank",
]  # fmt: skip
