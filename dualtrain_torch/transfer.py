"""Transfer: the one road from host memory to a torch device.

Every host -> device move of the torch adapter goes through a `Transfer`: Tank's delivery
(`dualtrain_torch.data.Courier` is this class), ``convert(..., device=...)``'s placement
(`TorchBackend.device_put`), the embedding store's fetch and the SpeedTorch shim. The JAX
adapter's `dualtrain_jax.transfer` has the same names.

On the CPU (and with no device) host arrays become tensors sharing their memory, through
`dualtrain.convert`, so its copy rules and copy counts hold. On CUDA each host array is
copied into a pinned staging buffer, reused across calls (pinning per call costs more than
it saves), and sent with ``non_blocking=True``; a buffer is refilled only after the copy that
last read it has finished (a CUDA event).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from dualtrain.cockpit.engine import Engine
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.interop import convert
from dualtrain.layout import canonical_strides
from dualtrain.tree import Path, map_with_path

__all__ = ["Transfer", "parse_device", "shared"]

_RING = 3  # pinned buffers per leaf: one being filled, one in flight, one spare
_RINGS = 64  # leaves (path, shape, dtype) with a ring at once; the least used goes first
_GPU_NAMES = ("cuda", "gpu", "rocm")  # what names a GPU, in either framework's words


def parse_device(device: Any) -> torch.device:
    """`device` as a ``torch.device`` this machine has: a missing one fails now, not per batch.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device`` (also ``"mps"``,
            ``"meta"``... where torch can allocate there), or a `dualtrain.Engine` (its
            device for this process).

    Raises:
        ArgumentError: naming `device`, the value and the devices there are (the same
            wording as `dualtrain_jax.transfer.parse_device`).
    """
    if isinstance(device, Engine):
        device = device.torch_device
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if isinstance(device, bool):  # torch would read True as cuda:1
        raise _refused(device, gpus)
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise _refused(device, gpus) from err
    if parsed.type == "cuda":
        if not 0 <= (parsed.index or 0) < gpus:
            raise _refused(device, gpus)
    elif parsed.type != "cpu":
        try:  # mps, xpu, meta, ...: torch knows whether it can allocate there
            torch.empty(0, device=parsed)
        except (RuntimeError, AssertionError, ValueError) as err:
            raise _refused(device, gpus) from err
    return parsed


def _refused(device: Any, gpus: int) -> ArgumentError:
    # Worded as dualtrain_jax.transfer words it (tests/exchange/cross/test_transfer_laws.py).
    known = ", ".join(["'cpu'", *(f"'cuda:{i}'" for i in range(gpus))])
    text = device if isinstance(device, str) else str(getattr(device, "type", ""))
    if text.partition(":")[0] in _GPU_NAMES and gpus == 0:
        known += "; CUDA is not available to torch"
    return bad_argument("device", device, f"a device torch has here ({known})")


class Transfer:
    """Moves host arrays (one, or a pytree of them) onto one torch device.

    ``Transfer(device)(tree)`` returns `tree` with every array leaf (NumPy, or anything
    `dualtrain.convert` takes) a tensor on `device`; other leaves come back unchanged. Once
    it returns, the caller may overwrite its host arrays: on CUDA they were copied into
    pinned staging buffers, elsewhere they are shared (as `convert` shares them).

    One Transfer serves one stream of batches (its staging ring is not for several threads
    at once); `put` keeps no state and is safe anywhere.

    Args:
        device: None (host tensors sharing the arrays' memory), ``"cpu"``, ``"cuda"``,
            ``"cuda:N"`` or a ``torch.device``.

    Attributes:
        device: the parsed ``torch.device``, or None.
        sent: arrays handed to `device` so far (by `put`, or staged by a call).

    Raises:
        ArgumentError: `device` is not a device this machine has.
    """

    def __init__(self, device: Any = None) -> None:
        self.device: torch.device | None = None if device is None else parse_device(device)
        self._cuda = self.device is not None and self.device.type == "cuda"
        self._rings: OrderedDict[tuple[Any, ...], list[tuple[torch.Tensor, Any]]] = OrderedDict()
        self._turn = 0
        self.sent = 0

    def __repr__(self) -> str:
        return f"Transfer(device={self.device!r})"

    def __call__(self, tree: Any) -> Any:
        """`tree` with every array leaf a tensor on `device` (see the class)."""
        if self.device is None:
            shared = _host_tensors(tree)
            return shared if shared is not None else convert(tree, to="torch")
        if self._cuda:
            self._turn = (self._turn + 1) % _RING
        return map_with_path(self._send, tree)

    def put(self, x: torch.Tensor) -> torch.Tensor:
        """One tensor onto `device` as it is, ``non_blocking`` (the same tensor if there).

        No staging: a host tensor in pinned memory must not be written until the copy is
        done (the caller's buffers, such as the embedding store's staging, or `convert`'s
        placement of a tensor it hands over).
        """
        self.sent += 1
        return x.to(self.device, non_blocking=True)

    def _send(self, path: Path, x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            if self._cuda and isinstance(x, np.ndarray):
                x = _readable(x)  # only read, into the staging buffer
            else:
                x = convert(x, to="torch")
                if not isinstance(x, torch.Tensor):
                    return x  # not an array: numbers, strings, None
        if self._cuda and x.is_cpu:
            return self._stage(path, x)
        return self.put(x)

    def _stage(self, path: Path, src: torch.Tensor) -> torch.Tensor:
        key = (path, src.shape, src.dtype)
        ring = self._rings.get(key)
        if ring is not None:
            self._rings.move_to_end(key)  # in use: the last to go
        else:
            ring = self._rings[key] = [
                (torch.empty(src.shape, dtype=src.dtype, pin_memory=True), None)
                for _ in range(_RING)
            ]
            if len(self._rings) > _RINGS:
                _, old = self._rings.popitem(last=False)
                for _, event in old:  # its buffers may be in flight still
                    if event is not None:
                        event.synchronize()
        pinned, event = ring[self._turn]
        if event is not None:
            event.synchronize()  # the copy that last read this buffer is done
        pinned.copy_(src)
        out = pinned.to(self.device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))  # the stream the copy ran on
        ring[self._turn] = (pinned, done)
        self.sent += 1
        return out


# Dtypes torch shares from NumPy as they are (what `convert` then does without a check).
_SHARED = frozenset(
    np.dtype(t) for t in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16",
                          "float32", "float64", "complex64", "complex128")
)  # fmt: skip


def _host_tensors(tree: Any) -> dict[Any, torch.Tensor] | None:
    """A dict of plain arrays (a Tank's batch) as tensors sharing them, or None.

    `convert(tree, to="torch")` gives the same tensors after its checks (about 10 µs a
    leaf); arrays it would copy or refuse (read-only, strided, foreign byte order, other
    dtypes) and other trees return None and go through it.
    """
    if type(tree) is not dict:
        return None
    for x in tree.values():
        if type(x) is not np.ndarray or x.dtype not in _SHARED or not x.dtype.isnative:
            return None
        flags = x.flags
        # Unused strides (of size-1 axes) that are not row-major: convert rewrites them.
        if not (flags.c_contiguous and flags.writeable) or canonical_strides(x) is not x:
            return None
    try:
        return {key: torch.from_numpy(x) for key, x in tree.items()}
    except ValueError:  # a negative stride on a size-1 axis: convert makes it canonical
        return None


def _readable(a: np.ndarray) -> torch.Tensor:
    """A host tensor over `a` without a copy where one exists (read-only arrays included)."""
    try:
        return convert(a, to="torch", copy=False)  # read only: sharing is safe
    except BufferError:  # a foreign byte order: convert makes (and counts) a native copy
        return convert(a, to="torch")


@functools.lru_cache(maxsize=32)
def _shared(device: torch.device) -> Transfer:
    return Transfer(device)


def shared(device: Any) -> Transfer:
    """The process-wide Transfer to `device` (what ``convert(..., device=...)`` places with).

    Raises:
        ArgumentError: `device` is not a device this machine has.
    """
    return _shared(parse_device(device))
