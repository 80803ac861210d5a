"""Leaving a run so that the process can end: the work this process dispatched finished first.

JAX dispatches asynchronously: a step returns arrays still being computed, and under several
processes those programs hold the run's collectives, which every process must enter. A
process whose universe returned right after its last step could reach interpreter exit (and
``jax.distributed``'s shutdown) while that step was still queued, and its peers then waited
in the collective until the run's timeout named the wrong process. So `release` waits, before
`JaxRuntime.leave` returns, until every array the process holds is computed and every
effect (a ``jax.debug`` callback, an ordered I/O effect) has run: what the torch adapter's
``distributed.exit`` does for gloo's worker threads.
"""

from __future__ import annotations

import jax

__all__ = ["pending", "release"]


def pending() -> int:
    """How many live arrays of this process are still being computed."""
    return sum(not a.is_ready() for a in jax.live_arrays())


def release() -> None:
    """Returns once every live array is computed and every dispatched effect has run."""
    for a in jax.live_arrays():
        if not a.is_deleted():
            a.block_until_ready()
    jax.effects_barrier()
