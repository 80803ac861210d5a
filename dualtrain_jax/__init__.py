"""dualtrain's JAX adapter: imports jax (and optax) and dualtrain, never torch."""

from __future__ import annotations

from dualtrain_jax.backend import JaxBackend

__all__ = ["JaxBackend"]
