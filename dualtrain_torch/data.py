"""Tank batches as torch tensors: zero-copy on the CPU, pinned staging on CUDA.

`Courier(device)` is what `dualtrain.fuel.Tank` hands each batch to. It is the adapter's
`Transfer` (`dualtrain_torch.transfer`) under Tank's name, so batches take the same road to
the device as every other host array. (JAX's Courier is a subclass: it copies small host
batches, which JAX copies faster than it imports; torch's import costs about 1 µs.)
"""

from __future__ import annotations

from dualtrain_torch.transfer import Transfer

__all__ = ["Courier"]

# One class, two names: Courier(device)(batch) -> batch on the device.
Courier = Transfer
