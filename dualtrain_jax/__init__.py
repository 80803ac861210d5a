"""dualtrain's JAX adapter: imports jax (and optax) and dualtrain, never torch.

The names below mirror the other adapter's (those both export are declared once, in
`dualtrain.facade`; tests/test_facades.py) and load lazily (PEP 562):
``import dualtrain_jax`` imports no submodule; each name imports its module on first use,
so the model half never pulls in what only the embedding store needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualtrain.deprecation import moved_modules
from dualtrain.facade import adapter_homes, adapter_moves, lazy

if TYPE_CHECKING:
    from dualtrain_jax.backend import JaxBackend
    from dualtrain_jax.batching import BatchModule, batch_loss, batch_topk
    from dualtrain_jax.batching.optim import member_optimizer
    from dualtrain_jax.compilation import accelerate, accelerate_model
    from dualtrain_jax.compilation.learner import TrainingLearner
    from dualtrain_jax.craft import Nozzle, Prober, Rudder, coat, realize, shell
    from dualtrain_jax.embeddings import JaxRows, attach
    from dualtrain_jax.transfer import Transfer

# Modules that moved into the capability subpackages (#32): their old names still import,
# with a DeprecationWarning. Those both adapters moved are `facade.SHARED_MOVES`.
moved_modules(adapter_moves(__name__, {"compile_cache": "compilation.cache"}))

# public name -> the submodule that defines it: the names both adapters export
# (`facade.SHARED_HOMES`) and this adapter's own
_HOMES = adapter_homes(__name__, {"JaxBackend": "backend", "JaxRows": "embeddings"})

__all__ = [
    "BatchModule",
    "JaxBackend",
    "JaxRows",
    "Nozzle",
    "Prober",
    "Rudder",
    "TrainingLearner",
    "Transfer",
    "accelerate",
    "accelerate_model",
    "attach",
    "batch_loss",
    "batch_topk",
    "coat",
    "member_optimizer",
    "realize",
    "shell",
]  # the keys of _HOMES


__getattr__, __dir__ = lazy(__name__, _HOMES)


if TYPE_CHECKING:
    # mypy's half of the seams' check (tests/test_seams.py is the runtime half): each
    # part of this adapter must be assignable to its Protocol (dualtrain.backends.PARTS).
    from dualtrain.checkpoint.seams import CheckpointPart
    from dualtrain.craft.seams import CraftPart, LayersPart
    from dualtrain.demo.seams import DemoPart
    from dualtrain.embeddings.seams import EmbeddingsPart
    from dualtrain.fuel.seams import DataPart
    from dualtrain.multiverse.seams import DistributedPart
    from dualtrain_jax import (
        checkpoint as _checkpoint,
        craft as _craft,
        data as _data,
        demo as _demo,
        distributed as _distributed,
        embeddings as _embeddings,
        layers as _layers,
    )

    _layers_meets: LayersPart = _layers
    _craft_meets: CraftPart = _craft
    _checkpoint_meets: CheckpointPart = _checkpoint
    _data_meets: DataPart = _data
    _embeddings_meets: EmbeddingsPart = _embeddings
    _demo_meets: DemoPart = _demo
    _distributed_meets: DistributedPart = _distributed
