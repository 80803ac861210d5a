"""Multiverse under torch (docs/multiverse.md): the adapter's ``distributed`` part.

`TRAITS` is what Multiverse reads before joining: importing this package imports no torch,
its other names load `runtime` on first use. `runtime` joins the run and holds
`TorchRuntime`; `learner` the data-parallel learner; `reduce` the metric and object
collectives; `agent` launches a run's workers through torch's elastic agent; `rows` a
batch's rows in a step and the `Joined` protocol the parts annotate against; `exit` the
process's orderly exit around gloo's threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualtrain.deprecation import moved_names
from dualtrain.multiverse.seams import DistributedTraits
from dualtrain_torch.distributed.agent import launch

if TYPE_CHECKING:
    from dualtrain_torch.distributed.runtime import SoloModule, SyncedModule, TorchRuntime, join

__all__ = ["TRAITS", "SoloModule", "SyncedModule", "TorchRuntime", "join", "launch"]

# One process a device, launched by torch's elastic agent and joined at rank 0's store when
# first needed; sync wraps models in DistributedDataParallel, which takes these keywords.
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
    agent=launch,
)


# The framework loads with `runtime`, on first use of one of its names; the rest of the
# old flat module's names are served at the old path with a DeprecationWarning.
__getattr__ = moved_names(__name__, "dualtrain_torch.distributed.runtime", current=__all__)
