"""Multiverse under torch (docs/multiverse.md): the adapter's ``distributed`` part.

`runtime` joins the run and holds `TorchRuntime`; `learner` the data-parallel learner;
`reduce` the metric and object collectives; `rows` the embedding rows' exchange; `exit` the
process's orderly exit around gloo's threads.
"""

from dualtrain_torch.distributed.runtime import SoloModule, SyncedModule, TorchRuntime, join

__all__ = ["SoloModule", "SyncedModule", "TorchRuntime", "join"]
