"""dualtrain: faster training under PyTorch and JAX from one library.

``import dualtrain`` imports neither torch nor jax. Framework code lives in the adapters,
``dualtrain_torch`` and ``dualtrain_jax``, which dualtrain loads only when asked for a
backend by name or handed an array of that framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dualtrain.errors import (
    ArgumentError,
    BackendError,
    CheckpointError,
    DtypeError,
    DualtrainError,
    OutOfRangeError,
    PackError,
    PrecisionWarning,
    ShapeError,
    TankWorkerError,
    WorkerError,
)
from dualtrain.version import __version__

if TYPE_CHECKING:  # for type checkers; at run time each name loads on first use
    from dualtrain.aerolog import DashBoard
    from dualtrain.backends import Backend, available, backend_of, load
    from dualtrain.checkpoint import TimeMachine
    from dualtrain.cockpit import CPU, GPU, Engine, GPUtil
    from dualtrain.craft import Craft, autopad, dock
    from dualtrain.embeddings import EmbeddingStore
    from dualtrain.fuel import Comburant, FuelGenerator, Tank
    from dualtrain.interop import CopyCount, convert, count_copies
    from dualtrain.memory import aligned_copy, aligned_empty, is_aligned
    from dualtrain.multiverse import Multiverse
    from dualtrain.preload import Preloader, accelerate_dataset

# Each public name and the module that defines it. `import dualtrain` loads none of them:
# a job that uses one part (a BatchModule sweep, a Tank) pays for that part only (loading
# them all cost about 0.4 s a process).
_LAZY = {
    "DashBoard": "dualtrain.aerolog",
    "Backend": "dualtrain.backends",
    "available": "dualtrain.backends",
    "backend_of": "dualtrain.backends",
    "load": "dualtrain.backends",
    "TimeMachine": "dualtrain.checkpoint",
    "CPU": "dualtrain.cockpit",
    "GPU": "dualtrain.cockpit",
    "Engine": "dualtrain.cockpit",
    "GPUtil": "dualtrain.cockpit",
    "Craft": "dualtrain.craft",
    "autopad": "dualtrain.craft",
    "dock": "dualtrain.craft",
    "EmbeddingStore": "dualtrain.embeddings",
    "Comburant": "dualtrain.fuel",
    "FuelGenerator": "dualtrain.fuel",
    "Tank": "dualtrain.fuel",
    "CopyCount": "dualtrain.interop",
    "convert": "dualtrain.interop",
    "count_copies": "dualtrain.interop",
    "aligned_copy": "dualtrain.memory",
    "aligned_empty": "dualtrain.memory",
    "is_aligned": "dualtrain.memory",
    "Multiverse": "dualtrain.multiverse",
    "Preloader": "dualtrain.preload",
    "accelerate_dataset": "dualtrain.preload",
}

# Seed tools' spellings that moved to the compat namespaces: still found here, with a
# DeprecationWarning naming the new path, for one release.
_MOVED = (
    "autoPad",
    "NebulDataset",
    "patch_dataset",
)

__all__ = [
    "ArgumentError",
    "Backend",
    "BackendError",
    "CPU",
    "CheckpointError",
    "CopyCount",
    "Comburant",
    "Craft",
    "DashBoard",
    "DtypeError",
    "DualtrainError",
    "EmbeddingStore",
    "Engine",
    "FuelGenerator",
    "GPU",
    "GPUtil",
    "Multiverse",
    "OutOfRangeError",
    "PackError",
    "PrecisionWarning",
    "Preloader",
    "ShapeError",
    "TankWorkerError",
    "Tank",
    "TimeMachine",
    "WorkerError",
    "__version__",
    "accelerate_dataset",
    "aligned_copy",
    "aligned_empty",
    "autopad",
    "available",
    "backend_of",
    "convert",
    "count_copies",
    "dock",
    "is_aligned",
    "load",
]


def __getattr__(name: str) -> Any:
    import importlib
    import importlib.util

    if name in _MOVED:
        from dualtrain.deprecation import moved_attribute

        return moved_attribute(__name__, name, _MOVED)  # not cached: each use warns
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"dualtrain.{name}") is not None:
        # A part by its module name (`dualtrain.fuel.Tank` after `import dualtrain`), as
        # when every part was loaded up front.
        value = importlib.import_module(f"dualtrain.{name}")
    else:
        raise AttributeError(f"module 'dualtrain' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
