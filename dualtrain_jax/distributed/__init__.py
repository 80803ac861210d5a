"""Multiverse under JAX (docs/multiverse.md): the adapter's ``distributed`` part.

`runtime` joins the run and holds `JaxRuntime`; `learner` the data-parallel learner;
`reduce` the metric and object collectives; `rows` the embedding rows' exchange.
"""

from dualtrain_jax.distributed.runtime import JaxRuntime, join

__all__ = ["JaxRuntime", "join"]
