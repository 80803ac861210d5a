"""dualtrain's PyTorch adapter: imports torch and dualtrain, never JAX.

The names below mirror the other adapter's (tests/test_facades.py) and load lazily (PEP 562):
``import dualtrain_torch`` imports no submodule; each name imports its module on first use,
so the model half never pulls in what only the embedding store needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualtrain.deprecation import moved_modules
from dualtrain.facade import lazy

if TYPE_CHECKING:
    from dualtrain_torch.backend import TorchBackend
    from dualtrain_torch.batching import BatchModule, batch_loss, batch_topk
    from dualtrain_torch.batching.optim import member_optimizer
    from dualtrain_torch.compilation import accelerate, accelerate_model
    from dualtrain_torch.compilation.learner import TrainingLearner
    from dualtrain_torch.craft import Nozzle, Prober, Rudder, coat, realize, shell
    from dualtrain_torch.embeddings import TorchRows, attach
    from dualtrain_torch.transfer import Transfer

# Modules that moved into the capability subpackages (#32): their old names still import,
# with a DeprecationWarning.
moved_modules(
    {
        "dualtrain_torch.batching_loss": "dualtrain_torch.batching.loss",
        "dualtrain_torch.batching_members": "dualtrain_torch.batching.members",
        "dualtrain_torch.batching_optim": "dualtrain_torch.batching.optim",
        "dualtrain_torch.batching_probe": "dualtrain_torch.batching.probe",
        "dualtrain_torch.batching_run": "dualtrain_torch.batching.run",
        "dualtrain_torch.batching_stacked": "dualtrain_torch.batching.stacked",
        "dualtrain_torch.compilation_keys": "dualtrain_torch.compilation.keys",
        "dualtrain_torch.compilation_learner": "dualtrain_torch.compilation.learner",
        "dualtrain_torch.compilation_module": "dualtrain_torch.compilation.module",
        "dualtrain_torch.compilation_probe": "dualtrain_torch.compilation.probe",
        "dualtrain_torch.compilation_rungs": "dualtrain_torch.compilation.rungs",
        "dualtrain_torch.distributed_learner": "dualtrain_torch.distributed.learner",
        "dualtrain_torch.distributed_reduce": "dualtrain_torch.distributed.reduce",
        "dualtrain_torch.distributed_rows": "dualtrain_torch.distributed.rows",
        "dualtrain_torch.distributed_exit": "dualtrain_torch.distributed.exit",
    }
)


# public name -> the submodule that defines it
_HOMES = {
    "BatchModule": "dualtrain_torch.batching",
    "batch_loss": "dualtrain_torch.batching",
    "batch_topk": "dualtrain_torch.batching",
    "member_optimizer": "dualtrain_torch.batching.optim",
    "TorchBackend": "dualtrain_torch.backend",
    "TrainingLearner": "dualtrain_torch.compilation.learner",
    "accelerate": "dualtrain_torch.compilation",
    "accelerate_model": "dualtrain_torch.compilation",
    "Nozzle": "dualtrain_torch.craft",
    "Prober": "dualtrain_torch.craft",
    "Rudder": "dualtrain_torch.craft",
    "TorchRows": "dualtrain_torch.embeddings",
    "Transfer": "dualtrain_torch.transfer",
    "attach": "dualtrain_torch.embeddings",
    "coat": "dualtrain_torch.craft",
    "realize": "dualtrain_torch.craft",
    "shell": "dualtrain_torch.craft",
}

__all__ = [
    "BatchModule",
    "Nozzle",
    "Prober",
    "Rudder",
    "TorchBackend",
    "TorchRows",
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


# nebulgym's spelling, moved to the compat namespace: here with a DeprecationWarning
_MOVED = ("patch_torch_module",)


__getattr__, __dir__ = lazy(__name__, _HOMES, moved=_MOVED)


if TYPE_CHECKING:
    # mypy's half of the seams' check (tests/test_seams.py is the runtime half): each
    # part of this adapter must be assignable to its Protocol (dualtrain.backends.PARTS).
    from dualtrain.checkpoint.seams import TorchCheckpointPart
    from dualtrain.craft.seams import CraftPart, LayersPart
    from dualtrain.demo.seams import DemoPart
    from dualtrain.embeddings.seams import TorchEmbeddingsPart
    from dualtrain.fuel.seams import DataPart
    from dualtrain.multiverse.seams import DistributedPart
    from dualtrain_torch import (
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
    _checkpoint_meets: TorchCheckpointPart = _checkpoint
    _data_meets: DataPart = _data
    _embeddings_meets: TorchEmbeddingsPart = _embeddings
    _demo_meets: DemoPart = _demo
    _distributed_meets: DistributedPart = _distributed
