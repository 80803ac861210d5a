"""What Multiverse reads of JAX's runtime before joining a run (imports no JAX)."""

from __future__ import annotations

from dualtrain.multiverse.seams import DistributedTraits

__all__ = ["TRAITS"]

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
