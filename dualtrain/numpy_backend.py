"""NumPy as a backend: the host reference every adapter is compared against."""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain import dtypes
from dualtrain.backends import BackendTraits
from dualtrain.errors import bad_argument
from dualtrain.layout import CARRIED, describe_dtype
from dualtrain.memory import aligned_copy, aligned_empty

__all__ = ["NumpyBackend", "make_backend"]


class NumpyBackend(BackendTraits):
    """The Backend protocol over NumPy host arrays (see `dualtrain.backends.Backend`)."""

    name = "numpy"
    marks_readonly = True

    def owns(self, x: Any) -> bool:
        return isinstance(x, (np.ndarray, np.generic))

    def on_host(self, x: Any) -> bool:
        return True

    def shares(self, x: Any, a: Any) -> bool:
        return True

    def device_of(self, x: Any) -> str:
        return "cpu"

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def unsupported(self, x: Any) -> str | None:
        dtype = np.asarray(x).dtype
        return None if dtype in CARRIED else "a NumPy " + describe_dtype(dtype).partition(" ")[2]

    def parse_device(self, device: Any) -> str:
        if str(device) != "cpu":
            raise bad_argument("device", device, "'cpu' or None for NumPy arrays")
        return "cpu"

    def data_address(self, x: Any) -> int:
        return int(np.asarray(x).ctypes.data)

    def to_host(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def exportable(self, x: Any) -> Any:
        return x

    def is_contiguous(self, x: Any) -> bool:
        return bool(np.asarray(x).flags.c_contiguous)

    def from_numpy(self, a: np.ndarray, *, readonly: bool) -> np.ndarray:
        if readonly and a.flags.writeable:
            a = a.view()
            a.flags.writeable = False
        return a

    def from_dlpack(self, x: Any, *, copy: bool | None, readonly: bool = False) -> np.ndarray:
        return self.from_numpy(np.from_dlpack(x, copy=copy), readonly=readonly)

    def device_put(self, x: Any, device: Any) -> np.ndarray:
        if not self.same_device(x, device):
            raise bad_argument("device", device, "'cpu' or None for NumPy arrays")
        return x

    def same_device(self, x: Any, device: Any) -> bool:
        return device is None or str(device) == "cpu"

    def copy(self, x: Any) -> np.ndarray:
        a = np.asarray(x)
        if a.dtype.hasobject:  # Python objects cannot live in a raw byte buffer
            return np.array(a, copy=True)
        return aligned_copy(a)

    def supports_x64(self) -> bool:
        return True

    def zeros(self, shape: tuple[int, ...], dtype: str, device: Any = None) -> np.ndarray:
        self.device_put(None, device)
        out = aligned_empty(shape, _dtype(dtype))
        out.fill(0)
        return out

    def stack(self, xs: list[Any], axis: int = 0) -> np.ndarray:
        return np.stack(xs, axis=axis)

    def take_rows(self, x: Any, idx: Any) -> np.ndarray:
        return np.take(x, idx, axis=0)

    def put_rows(self, x: Any, idx: Any, values: Any) -> np.ndarray:
        x[idx] = values
        return x


def _dtype(name: str) -> np.dtype:
    return dtypes.numpy_dtype(name)  # bfloat16 through ml_dtypes: dualtrain.dtypes


def make_backend() -> NumpyBackend:
    """Builds the NumPy backend (called once by `dualtrain.backends.load`)."""
    return NumpyBackend()
