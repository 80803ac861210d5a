"""Transfer: the one road from host memory to a JAX device or sharding.

Every host -> device move of the JAX adapter goes through a `Transfer`: Tank's delivery
(`dualtrain_jax.data.Courier` is this class), ``convert(..., device=...)``'s placement
(`JaxBackend.device_put`) and the embedding store's fetch. The torch adapter's
`dualtrain_torch.transfer` has the same names.

With no device, host arrays become JAX arrays sharing their memory, through
`dualtrain.convert`, so its copy rules and copy counts hold. With a device or a
``jax.sharding.Sharding`` each array goes through ``jax.device_put`` (a batch sharded over a
mesh's data axis, say); under ``jax.distributed`` with several processes a sharding makes
each process's array its local part of one global array
(``jax.make_array_from_process_local_data``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import numpy as np

from dualtrain.cockpit.engine import Engine
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.interop import convert
from dualtrain.tree import Path, map_with_path

__all__ = ["Transfer", "parse_device", "shared"]

_GPU_PLATFORMS = ("cuda", "gpu", "rocm")


def parse_device(device: Any) -> Any:
    """`device` as a ``jax.Device`` or ``jax.sharding.Sharding`` this machine has.

    Args:
        device: ``"cpu"``, ``"cpu:N"``, ``"gpu"``, ``"cuda:N"`` (or a ``torch.device``,
            read by its name), a ``jax.Device`` or a ``jax.sharding.Sharding``, or a
            `dualtrain.Engine` (its device for this process).

    Raises:
        ArgumentError: naming `device`, the value and the devices there are (the same
            wording as `dualtrain_torch.transfer.parse_device`).
    """
    if isinstance(device, Engine):
        return device.jax_device
    try:
        return resolve(device)
    except (RuntimeError, ValueError, IndexError, TypeError) as err:
        raise _refused(device) from err


def resolve(device: Any) -> Any:
    """A jax Device or Sharding from a Device, a Sharding, or text like ``"cuda:0"``.

    The unchecked form of `parse_device`: raises JAX's own errors (RuntimeError for a
    platform JAX lacks, IndexError, ValueError).
    """
    if isinstance(device, (jax.Device, jax.sharding.Sharding)):
        return device
    if isinstance(device, bool):
        raise TypeError("a bool names no device")
    if not isinstance(device, str):
        device = str(device)  # a torch.device names the same place: "cpu", "cuda:0"
    platform, _, index = device.partition(":")
    platform = "gpu" if platform in _GPU_PLATFORMS else platform
    if not (index or "0").isdigit():
        raise ValueError(f"bad device index {index!r}")
    return jax.devices(platform)[int(index or 0)]


def torch_name(platform: str) -> str:
    """The platform as torch names it (``"gpu"`` -> ``"cuda"``)."""
    return "cuda" if platform in _GPU_PLATFORMS else platform


def device_name(device: Any) -> str:
    """`device` as ``device_of`` reports it: ``"cpu"`` for host memory, else ``"cuda:N"``."""
    return "cpu" if device.platform == "cpu" else f"{torch_name(device.platform)}:{device.id}"


def _refused(device: Any) -> ArgumentError:
    # Worded as dualtrain_torch.transfer words it (tests/exchange/cross/test_transfer_laws.py).
    groups = [jax.devices()]
    if groups[0][0].platform != "cpu":
        with contextlib.suppress(RuntimeError):  # JAX_PLATFORMS may leave the CPU out
            groups.append(jax.devices("cpu"))
    names = []
    for devices in groups:
        name = torch_name(devices[0].platform)
        names += [
            name if (name == "cpu" and i == 0) else f"{name}:{i}" for i in range(len(devices))
        ]
    known = ", ".join(repr(n) for n in names)
    text = device if isinstance(device, str) else str(getattr(device, "type", ""))
    wants_gpu = text.partition(":")[0] in _GPU_PLATFORMS
    if wants_gpu and not any(d.platform in _GPU_PLATFORMS for d in groups[0]):
        known += "; CUDA is not available to JAX"
    return bad_argument("device", device, f"a device JAX has here ({known})")


class Transfer:
    """Moves host arrays (one, or a pytree of them) onto one JAX device or sharding.

    ``Transfer(device)(tree)`` returns `tree` with every array leaf (NumPy, or anything
    `dualtrain.convert` takes) a JAX array on `device`; other leaves come back unchanged.

    Args:
        device: None (arrays on the default device, sharing the host memory), ``"cpu"``,
            ``"gpu"``, ``"cuda:N"``, a ``jax.Device`` or a ``jax.sharding.Sharding``.

    Attributes:
        device: the parsed ``jax.Device`` or ``Sharding``, or None.
        sent: arrays handed to `device` so far (by `put`, or by a call).

    Raises:
        ArgumentError: `device` is not a device this machine has.
    """

    def __init__(self, device: Any = None) -> None:
        self.device: Any = None if device is None else parse_device(device)
        self._local = isinstance(self.device, jax.sharding.Sharding) and jax.process_count() > 1
        self.sent = 0

    def __repr__(self) -> str:
        return f"Transfer(device={self.device!r})"

    def __call__(self, tree: Any) -> Any:
        """`tree` with every array leaf a JAX array on `device` (see the class)."""
        if self.device is None:
            return convert(tree, to="jax")
        return map_with_path(self._send, tree)

    def put(self, x: Any) -> jax.Array:
        """One array onto `device` with ``jax.device_put`` (the same array if there)."""
        self.sent += 1
        return jax.device_put(x, self.device)

    def _send(self, path: Path, x: Any) -> Any:
        if not isinstance(x, (np.ndarray, jax.Array)):
            x = convert(x, to="jax")
            if not isinstance(x, jax.Array):
                return x  # not an array: numbers, strings, None
        if self._local:  # this process's rows of one global batch
            self.sent += 1
            return jax.make_array_from_process_local_data(self.device, x)
        return self.put(x)


@functools.lru_cache(maxsize=32)
def _shared(device: Any) -> Transfer:
    return Transfer(device)


def shared(device: Any) -> Transfer:
    """The process-wide Transfer to `device` (what ``convert(..., device=...)`` places with).

    Raises:
        ArgumentError: `device` is not a device this machine has.
    """
    return _shared(parse_device(device))
