"""Tank batches as JAX arrays: zero-copy on the CPU, device_put to a device or sharding."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.interop import convert

__all__ = ["Courier"]


class Courier:
    """Hands NumPy batches over as JAX arrays.

    `device` None imports the host arrays without a copy (Tank's buffers are 64-byte
    aligned). A `jax.Device` or `jax.sharding.Sharding` places each array with
    `jax.device_put` (a batch sharded over a mesh's data axis, say). Under
    `jax.distributed` with several processes, each process's batch is its local part of one
    global array (`jax.make_array_from_process_local_data`).
    """

    def __init__(self, device: Any = None) -> None:
        if device is not None and not isinstance(device, (jax.Device, jax.sharding.Sharding)):
            raise bad_argument("device", device, "None, a jax.Device or a jax.sharding.Sharding")
        self.device = device

    def __call__(self, batch: Any) -> Any:
        if self.device is None:
            return convert(batch, to="jax")
        if isinstance(self.device, jax.sharding.Sharding) and jax.process_count() > 1:
            return jax.tree.map(
                lambda x: jax.make_array_from_process_local_data(self.device, x)
                if isinstance(x, np.ndarray) else x, batch,
            )  # fmt: skip
        return jax.tree.map(
            lambda x: jax.device_put(x, self.device) if isinstance(x, np.ndarray) else x, batch
        )
