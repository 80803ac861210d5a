"""dualtrain's PyTorch adapter: imports torch and dualtrain, never JAX.

The names below mirror the other adapter's (those both export are declared once, in
`dualtrain.facade`; tests/test_facades.py) and load lazily (PEP 562):
``import dualtrain_torch`` imports no submodule; each name imports its module on first use,
so the model half never pulls in what only the embedding store needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualtrain.deprecation import moved_modules
from dualtrain.facade import adapter_homes, adapter_moves, lazy

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
# with a DeprecationWarning. Those both adapters moved are `facade.SHARED_MOVES`.
moved_modules(
    adapter_moves(
        __name__, {"batching_stacked": "batching.stacked", "distributed_exit": "distributed.exit"}
    )
)

# public name -> the submodule that defines it: the names both adapters export
# (`facade.SHARED_HOMES`) and this adapter's own
_HOMES = adapter_homes(__name__, {"TorchBackend": "backend", "TorchRows": "embeddings"})

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
