"""Multiverse under torch (docs/multiverse.md): the adapter's ``distributed`` part.

`TRAITS` is what Multiverse reads before joining: importing this package imports no torch,
its other names load `runtime` on first use. `runtime` joins the run and holds
`TorchRuntime`; `learner` the data-parallel learner; `reduce` the metric and object
collectives; `rows` the embedding rows' exchange; `exit` the process's orderly exit around
gloo's threads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dualtrain.multiverse.seams import DistributedTraits

if TYPE_CHECKING:
    from dualtrain_torch.distributed.runtime import SoloModule, SyncedModule, TorchRuntime, join

__all__ = ["TRAITS", "SoloModule", "SyncedModule", "TorchRuntime", "join"]

# One process a device, joined at rank 0's store when first needed; sync wraps models in
# DistributedDataParallel, which takes these keywords.
TRAITS = DistributedTraits(
    name="torch",
    engines=("jit",),
    engines_hint="'jit' (DDP) under torch",
    one_process_per_device=True,
    sync_options=(
        "bucket_cap_mb",
        "find_unused_parameters",
        "broadcast_buffers",
        "gradient_as_bucket_view",
        "static_graph",
    ),
    wraps_models=True,
)


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("dualtrain_torch.distributed.runtime"), name)
