"""Host buffers aligned for zero-copy hand-over.

JAX imports a host buffer without a copy only when its address is a multiple of 64 bytes,
and NumPy's large allocations start 16 bytes past such a boundary. Every host buffer that
dualtrain allocates comes from here, so the next hop into JAX is free.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["ALIGNMENT", "aligned_copy", "aligned_empty", "is_aligned"]

ALIGNMENT = 64  # bytes: JAX's CPU client requires it for zero-copy imports

# Called for every column of every batch: bound once.
_empty, _uint8 = np.empty, np.dtype(np.uint8)
_addressof, _from_buffer = ctypes.addressof, ctypes.c_char.from_buffer


def aligned_empty(shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary.

    Args:
        shape: the array shape.
        dtype: any NumPy dtype (ml_dtypes' bfloat16 included).

    Returns:
        A writable ndarray of `shape` and `dtype`, address % 64 == 0.
    """
    # A batch allocates one per column: the common call (a tuple, a NumPy dtype) converts
    # nothing.
    shape_t = shape if type(shape) is tuple else (
        (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    )  # fmt: skip
    if shape_t and min(shape_t) < 0:
        raise bad_argument("shape", shape, "a tuple of non-negative ints")
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    # Python ints: a product of np.int32 sizes would overflow. np.prod costs 6 µs a call.
    nbytes = int(math.prod(map(int, shape_t))) * dt.itemsize
    if dt.hasobject or dt.subdtype is not None:
        # NumPy refuses a view of bytes as references (object fields), and a subarray
        # dtype would change the shape: the byte view's own errors, as before.
        raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        return raw[:nbytes].view(dt).reshape(shape_t)
    raw = _empty(nbytes + ALIGNMENT, _uint8)
    # The address through ctypes' buffer view: 0.4 µs where `raw.ctypes.data` takes 1.2.
    offset = (-_addressof(_from_buffer(raw))) % ALIGNMENT  # type: ignore[arg-type]
    # The array keeps `raw` alive as its .base.
    return np.ndarray(shape_t, dt, buffer=raw, offset=offset)


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, 64-byte aligned, writable copy of `a` (same dtype and values)."""
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a, casting="no")
    return out


def is_aligned(a: np.ndarray, alignment: int = ALIGNMENT) -> bool:
    """Whether the data of `a` starts on an `alignment`-byte boundary."""
    return a.size == 0 or a.ctypes.data % alignment == 0
