"""TorchBackend: the Backend protocol in torch (documented in `dualtrain.backends`)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch

from dualtrain.backends import BackendTraits
from dualtrain.layout import CARRIED_NAMES
from dualtrain_torch import transfer

__all__ = ["TorchBackend", "make_backend"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
_CARRIED = frozenset(getattr(torch, name) for name in CARRIED_NAMES)


class TorchBackend(BackendTraits):
    """The Backend protocol over ``torch.Tensor``.

    Torch has no read-only tensors, so `marks_readonly` stays False: inference tensors are
    no substitute, since torch checks them only after an in-place kernel has written.
    """

    name = "torch"

    def owns(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor)

    def on_host(self, x: torch.Tensor) -> bool:
        return x.is_cpu

    def shares(self, x: torch.Tensor, a: np.ndarray) -> bool:
        return True  # Tensor.numpy() never copies

    def device_of(self, x: torch.Tensor) -> str:
        # Pinned memory is host memory: its NumPy view reaches JAX as a plain CPU buffer.
        return str(x.device)

    def to_numpy(self, x: torch.Tensor) -> np.ndarray:
        if not x.is_cpu:
            raise BufferError(f"tensor is on {x.device}, not in host memory")
        if x.requires_grad:
            x = x.detach()
        view = self.lazy_view(x)
        if view is not None:  # resolving it is a copy: the caller decides, and counts it
            raise BufferError(view)
        if x.dtype is torch.bfloat16:  # NumPy has no bfloat16: view the bits through ml_dtypes
            return x.view(torch.int16).numpy().view(_BF16)
        return x.numpy()

    def data_address(self, x: Any) -> int:
        return int(x.data_ptr())

    def unsupported(self, x: torch.Tensor) -> str | None:
        if x.is_quantized:
            return f"a quantized torch tensor ({x.dtype})"
        if x.layout is not torch.strided:
            return f"a torch {str(x.layout).removeprefix('torch.')} tensor"
        if x.is_nested:
            return "a nested torch tensor"
        if x.dtype not in _CARRIED:
            return f"a torch tensor of dtype {x.dtype}"
        return None

    def lazy_view(self, x: torch.Tensor) -> str | None:
        if x.is_conj():
            return "it is a conjugate view (is_conj()), whose values are not in memory"
        if x.is_neg():
            return "it is a negative view (is_neg()), whose values are not in memory"
        return None

    def parse_device(self, device: Any) -> torch.device:
        return transfer.parse_device(device)

    def to_host(self, x: torch.Tensor) -> np.ndarray:
        return self.to_numpy(self.exportable(x).cpu())

    def exportable(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().resolve_conj().resolve_neg()

    def is_contiguous(self, x: torch.Tensor) -> bool:
        return x.is_contiguous()

    def from_numpy(self, a: np.ndarray, *, readonly: bool) -> torch.Tensor:
        bf16 = a.dtype.char == _BF16.char and a.dtype == _BF16  # char first: dtype == is slow
        if bf16:
            a = a.view(np.int16)
        # The core shares a read-only buffer only under copy=False, the caller's promise not
        # to write; from_dlpack, unlike from_numpy, takes such an array without a warning.
        t = torch.from_dlpack(a) if readonly else torch.from_numpy(a)
        return t.view(torch.bfloat16) if bf16 else t

    def from_dlpack(self, x: Any, *, copy: bool | None, readonly: bool = False) -> torch.Tensor:
        return torch.from_dlpack(x, copy=copy)

    def device_put(self, x: torch.Tensor, device: Any) -> torch.Tensor:
        return transfer.shared(device).put(x)  # the adapter's one host -> device road

    def same_device(self, x: torch.Tensor, device: Any) -> bool:
        return device is None or x.device == torch.device(device)

    def copy(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().clone(memory_format=torch.contiguous_format)

    def supports_x64(self) -> bool:
        return True

    def zeros(self, shape: tuple[int, ...], dtype: str, device: Any = None) -> torch.Tensor:
        return torch.zeros(shape, dtype=getattr(torch, dtype), device=device)

    def stack(self, xs: list[torch.Tensor], axis: int = 0) -> torch.Tensor:
        return torch.stack(xs, dim=axis)

    def take_rows(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, idx)

    def put_rows(self, x: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return x.index_put_((idx,), values)


def make_backend() -> TorchBackend:
    """Builds the torch backend (called once by `dualtrain.backends.load`)."""
    return TorchBackend()
