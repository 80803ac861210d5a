"""Multiverse under JAX (docs/multiverse.md): the adapter's ``distributed`` part.

`traits` holds what Multiverse reads before joining (importing this package imports no
JAX: `join` and `JaxRuntime` load `runtime` on first use, which must come after the host
devices are asked for). `runtime` joins the run and holds `JaxRuntime`; `learner` the
data-parallel learner; `reduce` the metric and object collectives; `rows` the embedding
rows' exchange.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dualtrain_jax.distributed.traits import TRAITS

if TYPE_CHECKING:
    from dualtrain_jax.distributed.runtime import JaxRuntime, join

__all__ = ["TRAITS", "JaxRuntime", "join"]


def __getattr__(name: str) -> Any:
    if name in ("JaxRuntime", "join"):  # JAX itself, on first use
        return getattr(importlib.import_module(f"{__name__}.runtime"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
