"""Fuel: pack raw images into HDF5/npz, serve seeded batches from them, augment them.

- `FuelGenerator` packs the images listed in a CSV (with their labels) into a pack.
- `Tank` serves shuffled, resumable mini-batches of a pack as NumPy, torch or JAX arrays.
- `Comburant` composes seeded transforms (`Flip`, `Crop`, `Rotate`, `Brighten`, `Contrast`,
  `Saturate`, `Sampling`) whose draws depend only on (seed, epoch, row).
"""

from __future__ import annotations

from dualtrain.errors import TankWorkerError
from dualtrain.fuel.comburant import Comburant
from dualtrain.fuel.filelist import SkippedRow
from dualtrain.fuel.generator import FuelGenerator, PackReport, shard_paths
from dualtrain.fuel.images import decode
from dualtrain.fuel.pack import Column, Pack
from dualtrain.fuel.pipeline import default_collate
from dualtrain.fuel.streams import SampleKey, current_sample
from dualtrain.fuel.tank import Tank
from dualtrain.fuel.transforms import (
    Brighten,
    Contrast,
    Crop,
    Flip,
    Rotate,
    Sampling,
    Saturate,
    Transform,
)

__all__ = [
    "Brighten",
    "Column",
    "Comburant",
    "Contrast",
    "Crop",
    "Flip",
    "FuelGenerator",
    "Pack",
    "PackReport",
    "Rotate",
    "SampleKey",
    "Sampling",
    "Saturate",
    "SkippedRow",
    "Tank",
    "TankWorkerError",
    "Transform",
    "current_sample",
    "decode",
    "default_collate",
    "shard_paths",
]
