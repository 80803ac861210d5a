"""Foreign inputs to `convert`: any ``__dlpack__`` producer, raw DLPack capsules, refusals.

A leaf that no backend claims is classified here (producer, capsule or neither); a capsule is
wrapped as a producer (`Capsule`) after its device is read through ctypes, so that the
conversion plan (`dualtrain.interop`) imports either into NumPy or a framework without a copy
where the producer allows. `refusal` words the error for a dtype or kind that `convert` does
not carry.
"""

from __future__ import annotations

import ctypes
import datetime
from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, DtypeError
from dualtrain.tree import Path, format_path

CARRIES = (
    "convert carries dense arrays of bool, (u)int8-64, float16/32/64, bfloat16, complex64 and "
    "complex128 only: cast (or densify) it first"
)


def refusal(path: Path, what: str, dst: str) -> DtypeError:
    """The error for a leaf at `path` that is `what`, which `convert` cannot carry to `dst`."""
    return DtypeError(
        f"{format_path(path)} is {what}, which cannot be converted to {dst}; {CARRIES}"
    )


def numpy_import(x: Any, *, copy: bool | None) -> np.ndarray:
    """NumPy's DLPack import of the producer `x` (the host importer of `convert`'s plan)."""
    return np.from_dlpack(x, copy=copy)


# DLPack device types whose memory NumPy can read: CPU, CUDA-pinned, ROCm-pinned, managed.
HOST_DEVICES = frozenset({1, 3, 11, 13})
NOT_FOREIGN, PRODUCER, CAPSULE = range(3)
_CAPSULE_TYPE = type(datetime.datetime_CAPI)  # types.CapsuleType from Python 3.13 on
_foreign_kinds: dict[type, int] = {}


def foreign_kind(cls: type) -> int:
    """Whether a leaf type is a DLPack producer or capsule (cached: the hot path for scalars)."""
    kind = _foreign_kinds.get(cls)
    if kind is None:
        if cls is _CAPSULE_TYPE:
            kind = CAPSULE
        elif hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
            kind = PRODUCER
        else:
            kind = NOT_FOREIGN
        _foreign_kinds[cls] = kind
    return kind


_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


class Capsule:
    """A raw DLPack capsule dressed as a producer, which is what ``from_dlpack`` takes.

    The capsule is handed out as it is: importing it consumes it (its name becomes
    ``used_dltensor``), as with ``torch.from_dlpack``, and the result owns its memory.
    """

    __slots__ = ("capsule", "device", "legacy")

    def __init__(self, path: Path, capsule: Any) -> None:
        name = _capsule_name(capsule)
        if name in (b"used_dltensor", b"used_dltensor_versioned"):
            raise ArgumentError(
                f"{format_path(path)} is a DLPack capsule that was already consumed; a capsule "
                "can be imported only once: export the array again"
            )
        if name not in (b"dltensor", b"dltensor_versioned"):
            raise ArgumentError(
                f"{format_path(path)} is a PyCapsule named {name!r}, not a DLPack tensor "
                "(b'dltensor')"
            )
        # DLTensor starts with the data pointer, then DLDevice (two int32). A versioned
        # capsule holds it after its version (2 x uint32), manager, deleter and flags.
        start = _capsule_pointer(capsule, name) + (0 if name == b"dltensor" else 32)
        device = (ctypes.c_int32 * 2).from_address(start + 8)
        self.capsule, self.device = capsule, (int(device[0]), int(device[1]))
        self.legacy = name == b"dltensor"

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


class Producer:
    """A foreign producer, passed through, noting whether it exported an unversioned capsule."""

    __slots__ = ("legacy", "x")

    def __init__(self, x: Any) -> None:
        self.x, self.legacy = x, False

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        capsule = self.x.__dlpack__(*args, **kwargs)
        self.legacy = _capsule_name(capsule) == b"dltensor"
        return capsule

    def __dlpack_device__(self) -> Any:
        return self.x.__dlpack_device__()


def writable(a: np.ndarray) -> np.ndarray:
    """A writable alias of read-only `a` (same memory, no copy); it keeps `a` alive."""
    if a.size == 0:
        return np.empty(a.shape, a.dtype)
    low = sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True) if s < 0)
    high = sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True) if s > 0)
    memory = (ctypes.c_byte * (high - low + a.itemsize)).from_address(a.ctypes.data + low)
    memory.owner = a  # the alias's base chain reaches `a`, which holds the capsule
    return np.ndarray(a.shape, a.dtype, buffer=memory, offset=-low, strides=a.strides)
