"""dualtrain's JAX adapter: imports jax (and optax) and dualtrain, never torch.

The names below mirror the other adapter's (tests/test_facades.py) and load lazily (PEP 562):
``import dualtrain_jax`` imports no submodule; each name imports its module on first use,
so the model half never pulls in what only the embedding store needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualtrain.deprecation import moved_modules
from dualtrain.facade import lazy

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
# with a DeprecationWarning.
moved_modules(
    {
        "dualtrain_jax.batching_loss": "dualtrain_jax.batching.loss",
        "dualtrain_jax.batching_members": "dualtrain_jax.batching.members",
        "dualtrain_jax.batching_optim": "dualtrain_jax.batching.optim",
        "dualtrain_jax.batching_probe": "dualtrain_jax.batching.probe",
        "dualtrain_jax.batching_run": "dualtrain_jax.batching.run",
        "dualtrain_jax.compilation_keys": "dualtrain_jax.compilation.keys",
        "dualtrain_jax.compilation_learner": "dualtrain_jax.compilation.learner",
        "dualtrain_jax.compilation_module": "dualtrain_jax.compilation.module",
        "dualtrain_jax.compilation_probe": "dualtrain_jax.compilation.probe",
        "dualtrain_jax.compilation_rungs": "dualtrain_jax.compilation.rungs",
        "dualtrain_jax.distributed_learner": "dualtrain_jax.distributed.learner",
        "dualtrain_jax.distributed_reduce": "dualtrain_jax.distributed.reduce",
        "dualtrain_jax.distributed_rows": "dualtrain_jax.distributed.rows",
        "dualtrain_jax.compile_cache": "dualtrain_jax.compilation.cache",
    }
)


# public name -> the submodule that defines it
_HOMES = {
    "BatchModule": "dualtrain_jax.batching",
    "batch_loss": "dualtrain_jax.batching",
    "batch_topk": "dualtrain_jax.batching",
    "member_optimizer": "dualtrain_jax.batching.optim",
    "JaxBackend": "dualtrain_jax.backend",
    "TrainingLearner": "dualtrain_jax.compilation.learner",
    "accelerate": "dualtrain_jax.compilation",
    "accelerate_model": "dualtrain_jax.compilation",
    "Nozzle": "dualtrain_jax.craft",
    "Prober": "dualtrain_jax.craft",
    "Rudder": "dualtrain_jax.craft",
    "JaxRows": "dualtrain_jax.embeddings",
    "Transfer": "dualtrain_jax.transfer",
    "attach": "dualtrain_jax.embeddings",
    "coat": "dualtrain_jax.craft",
    "realize": "dualtrain_jax.craft",
    "shell": "dualtrain_jax.craft",
}

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
