"""Multiverse under JAX (docs/multiverse.md): the adapter's ``distributed`` part.

`TRAITS` is what Multiverse reads before joining: importing this package imports no JAX
(`join` and `JaxRuntime` load `runtime` on first use, which must come after the host devices
are asked for). `runtime` joins the run and holds `JaxRuntime`; `learner` the data-parallel
learner; `reduce` the metric and object collectives; `rows` the embedding rows' exchange.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dualtrain.multiverse.seams import DistributedTraits

if TYPE_CHECKING:
    from dualtrain_jax.distributed.runtime import JaxRuntime, join

__all__ = ["TRAITS", "JaxRuntime", "join"]

# A process drives several devices (host devices on the CPU); several processes meet at
# jax.distributed's coordinator, and only before they compute anything; sync takes no option.
TRAITS = DistributedTraits(
    name="JAX",
    engines=("jit", "pmap"),
    engines_hint="'jit' or 'pmap'",
    host_devices=True,
    coordinator=True,
    joins_early=True,
)


def __getattr__(name: str) -> Any:
    if name in ("JaxRuntime", "join"):  # JAX itself, on first use
        return getattr(importlib.import_module(f"{__name__}.runtime"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
