"""Tank batches as torch tensors: zero-copy on the CPU, pinned staging on CUDA."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dualtrain.errors import bad_argument
from dualtrain.interop import convert
from dualtrain.tree import map_with_path

__all__ = ["Courier"]

_RING = 3  # pinned buffers per batch key: one being filled, one in flight, one spare


class Courier:
    """Hands NumPy batches over as torch tensors on `device`.

    On the CPU the tensors share the batch's memory. On CUDA each array is copied into a
    pinned staging buffer, reused across batches (pinning per batch costs more than it
    saves), and sent with ``non_blocking=True``; a buffer is reused only after the copy that
    read it has finished (a CUDA event).
    """

    def __init__(self, device: Any = None) -> None:
        self.device = None if device is None else _device(device)
        self._cuda = self.device is not None and self.device.type == "cuda"
        self._ring: dict[tuple[Any, ...], list[tuple[torch.Tensor, Any]]] = {}
        self._turn = 0

    def __call__(self, batch: Any) -> Any:
        if not self._cuda:
            out = convert(batch, to="torch")
            if self.device is None or self.device.type == "cpu":
                return out
            return map_with_path(lambda _, t: t.to(self.device) if torch.is_tensor(t) else t, out)
        self._turn = (self._turn + 1) % _RING
        return map_with_path(self._send, batch)

    def _send(self, path: Any, x: Any) -> Any:
        if not isinstance(x, np.ndarray):
            return x
        src = torch.from_numpy(np.ascontiguousarray(x))
        ring = self._ring.setdefault((path, src.shape, src.dtype), [])
        while len(ring) < _RING:
            ring.append((torch.empty(src.shape, dtype=src.dtype, pin_memory=True), None))
        pinned, event = ring[self._turn]
        if event is not None:
            event.synchronize()  # the copy that last read this buffer is done
        pinned.copy_(src)
        out = pinned.to(self.device, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        ring[self._turn] = (pinned, done)
        return out


def _device(device: Any) -> torch.device:
    """`device` as a torch.device that is there: a missing one fails now, not per batch."""
    try:
        out = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise bad_argument("device", device, "a torch device ('cpu', 'cuda', 'cuda:0')") from None
    if out.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise bad_argument("device", device, "a device this machine has: CUDA is not available")
        if out.index is not None and not 0 <= out.index < count:
            raise bad_argument("device", device, f"a CUDA device index below {count}")
    elif out.type != "cpu":
        try:
            torch.empty(0, device=out)
        except (RuntimeError, AssertionError, ValueError) as e:
            raise bad_argument("device", device, f"a device this machine has ({e})") from None
    return out
