"""Tank batches as JAX arrays: zero-copy on the CPU, device_put to a device or sharding.

`Courier(device)` is what `dualtrain.fuel.Tank` hands each batch to. It is the adapter's
`Transfer` (`dualtrain_jax.transfer`) under Tank's name, so batches take the same road to
the device as every other host array.
"""

from __future__ import annotations

from dualtrain_jax.transfer import Transfer

__all__ = ["Courier"]

# One class, two names: Courier(device)(batch) -> batch on the device or sharding.
Courier = Transfer
