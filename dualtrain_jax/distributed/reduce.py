"""JAX's `reduce`: each process's leaves gathered exactly (as bytes) and combined on the host.

The torch adapter's ``distributed.reduce`` has the same role. The layout travels with the
values, so processes holding different structures fail together instead of hanging.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_jax.distributed.rows import Joined

__all__ = ["local_value", "reduce_value"]


def reduce_value(runtime: Joined, value: Any, aggregate: bool) -> Any:
    """`value` averaged (summed when `aggregate`) over the processes: `JaxRuntime.reduce`."""
    if runtime.processes == 1:
        return value
    leaves, treedef = jax.tree.flatten(value)
    local = [local_value(x) for x in leaves]
    # The layout travels with the values: leaves paired by position alone would average
    # one rank's "b" with another's "c", or fail on one rank only and hang the others.
    layout = (str(treedef), [np.shape(x) for x in local])
    every = runtime.gather_object((layout, local))  # exact: no float64 -> float32 on the way
    layouts = [rank[0] for rank in every]
    if any(other != layout for other in layouts):
        described = "; ".join(
            f"rank {r}: {tree} with shapes {shapes}" for r, (tree, shapes) in enumerate(layouts)
        )
        raise ArgumentError(
            "value must have the same structure and shapes on every process (reduce "
            f"pairs the processes' leaves); got {described}"
        )
    out = []
    for i, leaf in enumerate(leaves):
        stacked = np.stack([np.asarray(rank[1][i]) for rank in every])
        out.append(_like(leaf, _combine(stacked, aggregate)))
    return jax.tree.unflatten(treedef, out)


def local_value(x: Any) -> Any:
    """`x` as this process holds it: a host NumPy value (a global array: its local copy)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if not x.is_fully_replicated:
            raise bad_argument(
                "value",
                x,
                "this process's own value (a global array sharded over processes has no "
                "per-process value: reduce its local rows)",
            )
        x = x.addressable_data(0)
    return np.asarray(x)


def _combine(stacked: np.ndarray, aggregate: bool) -> np.ndarray:
    if aggregate:
        return stacked.sum(0, dtype=stacked.dtype if stacked.dtype != np.bool_ else None)
    mean = stacked.mean(0)
    return mean.astype(stacked.dtype) if np.issubdtype(stacked.dtype, np.floating) else mean


def _like(leaf: Any, value: np.ndarray) -> Any:
    """`value` in the kind of `leaf`: Python number, NumPy scalar or array, JAX array."""
    if isinstance(leaf, jax.Array):
        return jnp.asarray(value)
    if isinstance(leaf, np.ndarray):
        return np.asarray(value)
    if isinstance(leaf, np.generic):
        return value[()]
    if isinstance(leaf, (bool, int)) and np.issubdtype(value.dtype, np.integer):
        return int(value)
    return float(value)
