"""Multiverse under torch (docs/multiverse.md): the adapter's ``distributed`` part.

`traits` holds what Multiverse reads before joining; importing this package imports no
torch: its other names load `runtime` on first use. `runtime` joins the run and holds
`TorchRuntime`; `learner` the data-parallel learner; `reduce` the metric and object
collectives; `rows` the embedding rows' exchange; `exit` the process's orderly exit around
gloo's threads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dualtrain_torch.distributed.traits import TRAITS

if TYPE_CHECKING:
    from dualtrain_torch.distributed.runtime import SoloModule, SyncedModule, TorchRuntime, join

__all__ = ["TRAITS", "SoloModule", "SyncedModule", "TorchRuntime", "join"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("dualtrain_torch.distributed.runtime"), name)
