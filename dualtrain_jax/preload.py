"""Pinned staging for the preloader: held arrays in JAX's pinned host memory on a GPU.

`dualtrain.preload.Preloader(pin_memory="jax")` passes each item through `pin` before
holding it, so the copy to the GPU starts from page-locked memory.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from dualtrain.preload.copies import map_leaves

__all__ = ["pickle_reduce", "pin"]


def pin(item: Any, /) -> Any:
    """`item` with its NumPy arrays as JAX arrays in pinned host memory of the first GPU.

    Without a GPU the item itself, unchanged.
    """
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:  # no GPU backend
        return item
    if not gpus:
        return item
    pinned = jax.sharding.SingleDeviceSharding(gpus[0], memory_kind="pinned_host")

    def leaf(x: Any) -> Any:
        if isinstance(x, np.ndarray) and x.dtype != object:
            return jax.device_put(x, pinned)
        return x

    return map_leaves(item, leaf)


def pickle_reduce(obj: Any, /) -> tuple[Any, ...] | None:
    """None: a JAX array's own pickle already sends its bytes as a NumPy array."""
    return None
