"""dualtrain's JAX adapter: imports jax (and optax) and dualtrain, never torch."""

from __future__ import annotations

from dualtrain_jax.backend import JaxBackend
from dualtrain_jax.embeddings import JaxRows, attach

__all__ = ["JaxBackend", "JaxRows", "attach"]
