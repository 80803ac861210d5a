"""The preloader: datasets' items cached within a real byte budget, loaded ahead in order.

nebulgym's ``accelerate_dataset`` done right (docs/preload.md): `Preloader` wraps anything
indexable, `accelerate_dataset` / `patch_dataset` decorate a dataset class, `NebulDataset`
is nebulgym's class spelling, and a Tank takes the same cache with ``preload=``. The bytes
held never exceed ``max_memory_size`` (`dualtrain.preload.sizes` counts them); the order of
use comes from ``order=``, a sampler or a Tank, never from guessing. This package imports
neither torch nor JAX (their pinned staging is each adapter's ``preload`` module).
"""

from __future__ import annotations

from dualtrain.preload.budget import DEFAULT_FRACTION, available_memory, default_budget
from dualtrain.preload.cache import PreloadCache
from dualtrain.preload.copies import fresh
from dualtrain.preload.decorators import accelerate_dataset, patch_dataset
from dualtrain.preload.preloader import NebulDataset, PlannedSampler, Preloader
from dualtrain.preload.sizes import nbytes

__all__ = [
    "DEFAULT_FRACTION",
    "NebulDataset",
    "PlannedSampler",
    "PreloadCache",
    "Preloader",
    "accelerate_dataset",
    "available_memory",
    "default_budget",
    "fresh",
    "nbytes",
    "patch_dataset",
]
