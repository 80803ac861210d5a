"""dualtrain: faster training under PyTorch and JAX from one library.

``import dualtrain`` imports neither torch nor jax. Framework code lives in the adapters,
``dualtrain_torch`` and ``dualtrain_jax``, which dualtrain loads only when asked for a
backend by name or handed an array of that framework.
"""

from __future__ import annotations

from dualtrain.aerolog import DashBoard
from dualtrain.backends import Backend, available, backend_of, load
from dualtrain.checkpoint import TimeMachine
from dualtrain.cockpit import CPU, GPU, Engine, GPUtil
from dualtrain.craft import Craft, autoPad, autopad, dock
from dualtrain.embeddings import EmbeddingStore
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
from dualtrain.fuel import Comburant, FuelGenerator, Tank
from dualtrain.interop import CopyCount, convert, count_copies
from dualtrain.memory import aligned_copy, aligned_empty, is_aligned
from dualtrain.multiverse import Multiverse
from dualtrain.preload import NebulDataset, Preloader, accelerate_dataset, patch_dataset
from dualtrain.version import __version__

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
    "NebulDataset",
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
    "autoPad",
    "autopad",
    "available",
    "backend_of",
    "convert",
    "count_copies",
    "dock",
    "is_aligned",
    "load",
    "patch_dataset",
]
