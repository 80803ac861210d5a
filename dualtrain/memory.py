"""Host buffers aligned for zero-copy hand-over.

JAX imports a host buffer without a copy only when its address is a multiple of 64 bytes,
and NumPy's large allocations start 16 bytes past such a boundary. Every host buffer that
dualtrain allocates comes from here, so the next hop into JAX is free.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["ALIGNMENT", "aligned_copy", "aligned_empty", "is_aligned"]

ALIGNMENT = 64  # bytes: JAX's CPU client requires it for zero-copy imports


def aligned_empty(shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary.

    Args:
        shape: the array shape.
        dtype: any NumPy dtype (ml_dtypes' bfloat16 included).

    Returns:
        A writable ndarray of `shape` and `dtype`, address % 64 == 0.
    """
    shape_t = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(int(n) < 0 for n in shape_t):
        raise bad_argument("shape", shape, "a tuple of non-negative ints")
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape_t, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    # The view keeps `raw` alive through its .base chain.
    return raw[offset : offset + nbytes].view(dt).reshape(shape_t)


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, 64-byte aligned, writable copy of `a` (same dtype and values)."""
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a, casting="no")
    return out


def is_aligned(a: np.ndarray, alignment: int = ALIGNMENT) -> bool:
    """Whether the data of `a` starts on an `alignment`-byte boundary."""
    return a.size == 0 or a.ctypes.data % alignment == 0
