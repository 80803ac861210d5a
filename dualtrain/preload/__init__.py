"""The preloader: datasets' items cached within a real byte budget, loaded ahead in order.

nebulgym's ``accelerate_dataset`` done right (docs/preload.md): `Preloader` wraps anything
indexable, `accelerate_dataset` decorates a dataset class (nebulgym's spellings are in
`dualtrain_torch.compat.nebulgym`), and a Tank takes the same cache with ``preload=``. The bytes
held never exceed ``max_memory_size`` (`dualtrain.preload.sizes` counts them); the order of
use comes from ``order=``, a sampler or a Tank, never from guessing. This package imports
neither torch nor JAX (their pinned staging is each adapter's ``preload`` module).
"""

from __future__ import annotations

from dualtrain.deprecation import seed_spellings
from dualtrain.preload.budget import DEFAULT_FRACTION, available_memory, default_budget
from dualtrain.preload.cache import PreloadCache
from dualtrain.preload.copies import fresh
from dualtrain.preload.decorators import accelerate_dataset
from dualtrain.preload.preloader import PlannedSampler, Preloader
from dualtrain.preload.sizes import nbytes

__all__ = [
    "DEFAULT_FRACTION",
    "PlannedSampler",
    "PreloadCache",
    "Preloader",
    "accelerate_dataset",
    "available_memory",
    "default_budget",
    "fresh",
    "nbytes",
]

# Seed spellings served with a warning (dualtrain.deprecation.SEED_SPELLINGS).
__getattr__ = seed_spellings(
    __name__,
    (
        "NebulDataset",
        "patch_dataset",
    ),
)
