"""CuPy as a backend, for GPU arrays only.

The core may not import CuPy. `dualtrain.backends.load("cupy")` imports it by name (the one
door to frameworks) and this module reads it from ``sys.modules``: its verbs are as thin as
an adapter's, so it needs no package of its own.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from dualtrain.backends import BackendTraits
from dualtrain.errors import bad_argument

__all__ = ["CupyBackend", "make_backend"]


class CupyBackend(BackendTraits):
    """The Backend protocol over ``cupy.ndarray`` (device memory; nothing is on the host)."""

    name = "cupy"
    device_only = True

    def __init__(self, cupy: Any) -> None:
        self.cp = cupy

    def owns(self, x: Any) -> bool:
        return isinstance(x, self.cp.ndarray)

    def on_host(self, x: Any) -> bool:
        return False

    def shares(self, x: Any, a: Any) -> bool:
        return False

    def device_of(self, x: Any) -> str:
        return f"cuda:{x.device.id}"

    def data_address(self, x: Any) -> int:
        return int(x.data.ptr)

    def to_numpy(self, x: Any) -> np.ndarray:
        raise BufferError("CuPy arrays live in device memory; use to_host")

    def to_host(self, x: Any) -> np.ndarray:
        return self.cp.asnumpy(x)

    def exportable(self, x: Any) -> Any:
        return x

    def is_contiguous(self, x: Any) -> bool:
        return bool(x.flags.c_contiguous)

    def from_numpy(self, a: np.ndarray, *, readonly: bool) -> Any:
        return self.cp.asarray(a)  # host -> device: always a transfer

    def from_dlpack(self, x: Any, *, copy: bool | None, readonly: bool = False) -> Any:
        out = self.cp.from_dlpack(x)
        return out.copy() if copy else out

    def parse_device(self, device: Any) -> int:
        count = self.cp.cuda.runtime.getDeviceCount()
        known = ", ".join(f"'cuda:{i}'" for i in range(count))
        try:
            index = _index(device)
        except (TypeError, ValueError) as err:
            raise bad_argument("device", device, f"a CUDA device CuPy has ({known})") from err
        if not 0 <= index < count:
            raise bad_argument("device", device, f"a CUDA device CuPy has ({known})")
        return index

    def device_put(self, x: Any, device: Any) -> Any:
        with self.cp.cuda.Device(_index(device)):
            return self.cp.asarray(x)

    def same_device(self, x: Any, device: Any) -> bool:
        return device is None or x.device.id == _index(device)

    def copy(self, x: Any) -> Any:
        return x.copy()

    def supports_x64(self) -> bool:
        return True

    def zeros(self, shape: tuple[int, ...], dtype: str, device: Any = None) -> Any:
        with self.cp.cuda.Device(_index(device)):
            return self.cp.zeros(shape, dtype=dtype)

    def stack(self, xs: list[Any], axis: int = 0) -> Any:
        return self.cp.stack(xs, axis=axis)

    def take_rows(self, x: Any, idx: Any) -> Any:
        return self.cp.take(x, idx, axis=0)

    def put_rows(self, x: Any, idx: Any, values: Any) -> Any:
        x[idx] = values
        return x


def _index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    platform, _, index = str(device).partition(":")
    if platform not in ("cuda", "gpu") or not (index or "0").isdigit():
        raise ValueError(f"not a CUDA device: {device!r}")
    return int(index or 0)


def make_backend() -> CupyBackend:
    """Builds the CuPy backend from the module `dualtrain.backends` imported by name."""
    return CupyBackend(sys.modules["cupy"])
