"""Foreign inputs to `convert`: any ``__dlpack__`` producer, raw DLPack capsules, refusals.

A leaf that no backend claims is classified here (producer, capsule or neither); a capsule is
wrapped as a producer after its device is read through ctypes, and `_ForeignInputs` (mixed
into the conversion plan) imports either into NumPy or a framework without a copy where the
producer allows. `_refusal` words the error for a dtype or kind that `convert` does not carry.
"""

from __future__ import annotations

import ctypes
import datetime
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from dualtrain import backends
from dualtrain.errors import ArgumentError, DtypeError
from dualtrain.tree import Path, format_path


class _ForeignInputs:
    """The conversion plan's methods for foreign producers and raw DLPack capsules."""

    __slots__ = ()

    dst: Any
    _take: Callable[[Path, Any, Any], Any]

    def _import_foreign(self, path: Path, x: Any, kind: int) -> Any:
        """`x` imported without a copy into NumPy (host) or `to` (device), to go on from there.

        Copies happen only where the producer refuses to share (counted, refused under
        ``copy=False``); a device array bound for NumPy is imported by a framework in use and
        gathered from there, like that framework's own arrays.
        """
        x = _Capsule(path, x) if kind == _CAPSULE else _Producer(x)
        try:
            device = tuple(x.__dlpack_device__())
        except Exception as err:  # a producer's own failure, whatever its type
            raise ArgumentError(
                f"{format_path(path)} has __dlpack__ but its __dlpack_device__() failed: {err!r}"
            ) from err
        if device[0] in _HOST_DEVICES:
            try:
                a = self._take(path, x, _numpy_import)
            except (RuntimeError, ValueError) as err:  # a dtype NumPy cannot import (bfloat16)
                return self._via_framework(path, x, f"NumPy cannot import it ({err})")
            # An unversioned capsule has no read-only flag, so NumPy marks its array read-only.
            # The DLPack spec forbids exporting read-only memory that way: it is writable,
            # as torch.from_dlpack takes it.
            return _writable(a) if x.legacy and not a.flags.writeable else a
        if self.dst.name == "numpy":  # through a framework, whose gather to host is counted
            where = f"it lives on DLPack device {device}"
            return self._via_framework(path, x, where, BufferError)
        return self._checked(path, self.dst, self._take(path, x, self.dst.from_dlpack))

    def _via_framework(
        self, path: Path, x: Any, why: str, error: type[Exception] = DtypeError
    ) -> Any:
        """A producer NumPy cannot take (bfloat16, float8, device memory), via a framework in use.

        JAX goes first where it is loaded: torch.from_dlpack aborts the process on negative
        strides, while JAX refuses them with an error.
        """
        names = ["jax", "torch"] if self.dst.name == "numpy" else [self.dst.name, "jax", "torch"]
        for name in dict.fromkeys(names):
            if name != self.dst.name and sys.modules.get(name) is None:
                continue
            backend = backends.load(name)
            try:
                y = self._take(path, x, backend.from_dlpack)
            except BufferError:
                raise
            except Exception:  # each framework refuses in its own way; the next may take it
                continue
            return self._checked(path, backend, y)
        raise error(
            f"{format_path(path)} is a DLPack export that no framework in use could import "
            f"({why}); {_CARRIES}"
        )

    def _checked(self, path: Path, backend: Any, y: Any) -> Any:
        what = backend.unsupported(y)
        if what is not None:
            raise _refusal(path, f"a DLPack export that arrives as {what}", self.dst.name)
        return y


_CARRIES = (
    "convert carries dense arrays of bool, (u)int8-64, float16/32/64, bfloat16, complex64 and "
    "complex128 only: cast (or densify) it first"
)


def _refusal(path: Path, what: str, dst: str) -> DtypeError:
    return DtypeError(
        f"{format_path(path)} is {what}, which cannot be converted to {dst}; {_CARRIES}"
    )


def _numpy_import(x: Any, *, copy: bool | None) -> np.ndarray:
    return np.from_dlpack(x, copy=copy)


# DLPack device types whose memory NumPy can read: CPU, CUDA-pinned, ROCm-pinned, managed.
_HOST_DEVICES = frozenset({1, 3, 11, 13})
_NOT_FOREIGN, _PRODUCER, _CAPSULE = range(3)
_CAPSULE_TYPE = type(datetime.datetime_CAPI)  # types.CapsuleType from Python 3.13 on
_foreign_kinds: dict[type, int] = {}


def _foreign_kind(cls: type) -> int:
    """Whether a leaf type is a DLPack producer or capsule (cached: the hot path for scalars)."""
    kind = _foreign_kinds.get(cls)
    if kind is None:
        if cls is _CAPSULE_TYPE:
            kind = _CAPSULE
        elif hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
            kind = _PRODUCER
        else:
            kind = _NOT_FOREIGN
        _foreign_kinds[cls] = kind
    return kind


_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


class _Capsule:
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


class _Producer:
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


def _writable(a: np.ndarray) -> np.ndarray:
    """A writable alias of read-only `a` (same memory, no copy); it keeps `a` alive."""
    if a.size == 0:
        return np.empty(a.shape, a.dtype)
    low = sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True) if s < 0)
    high = sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True) if s > 0)
    memory = (ctypes.c_byte * (high - low + a.itemsize)).from_address(a.ctypes.data + low)
    memory.owner = a  # the alias's base chain reaches `a`, which holds the capsule
    return np.ndarray(a.shape, a.dtype, buffer=memory, offset=-low, strides=a.strides)
