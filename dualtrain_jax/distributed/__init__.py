"""Multiverse under JAX (docs/multiverse.md): the adapter's ``distributed`` part.

`TRAITS` is what Multiverse reads before joining: importing this package imports no JAX
(`join` and `JaxRuntime` load `runtime` on first use, which must come after the host devices
are asked for). `runtime` joins the run and holds `JaxRuntime`; `learner` the data-parallel
learner; `reduce` the metric and object collectives; `agent` spawns and supervises a run's
workers (JAX has no agent of its own); `rows` a batch's rows in a step and the `Joined`
protocol the parts annotate against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualtrain.deprecation import moved_names
from dualtrain.multiverse.seams import DistributedTraits
from dualtrain_jax.distributed.agent import launch

if TYPE_CHECKING:
    from dualtrain_jax.distributed.runtime import JaxRuntime, join

__all__ = ["TRAITS", "JaxRuntime", "join", "launch"]

# A process drives several devices (host devices on the CPU); several processes, spawned by
# the adapter's own agent, meet at jax.distributed's coordinator, and only before they compute
# anything; sync takes no option.
TRAITS = DistributedTraits(
    name="JAX",
    engines=("jit", "pmap"),
    engines_hint="'jit' or 'pmap'",
    host_devices=True,
    coordinator=True,
    joins_early=True,
    agent=launch,
)


# The framework loads with `runtime`, on first use of one of its names; the rest of the
# old flat module's names are served at the old path with a DeprecationWarning.
__getattr__ = moved_names(
    __name__, "dualtrain_jax.distributed.runtime", current=("JaxRuntime", "join")
)
