"""Multiverse: data-parallel training on torch.distributed and on JAX's runtime, one API.

`Multiverse` runs a training function on several workers (spawned, or joined from torchrun
or SLURM); `World` is one process's place in a run; the adapters' ``distributed`` modules
meet `seams.DistributedPart`. See docs/multiverse.md.
"""

from __future__ import annotations

from dualtrain.errors import WorkerError
from dualtrain.multiverse.multiverse import Multiverse, main_decorator
from dualtrain.multiverse.rank_zero import RankZeroTimeMachine
from dualtrain.multiverse.world import World, from_environment

__all__ = [
    "Multiverse",
    "RankZeroTimeMachine",
    "WorkerError",
    "World",
    "from_environment",
    "main_decorator",
]
