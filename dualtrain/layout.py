"""What a host array must look like before a framework can share it, and why it cannot.

These rules are framework-free: they read a NumPy view of the array and the receiving
backend's declared needs (`compact_only`, `host_alignment`, `takes_readonly_host`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain import dtypes

__all__ = [
    "CARRIED",
    "CARRIED_NAMES",
    "NARROWER",
    "canonical_strides",
    "copy_reason",
    "describe_dtype",
    "describe_layout",
    "dtypes_named",
    "is_compact",
]

# The 32-bit dtype a 64-bit one becomes where a framework runs without 64-bit types.
NARROWER: dict[np.dtype, np.dtype] = {
    np.dtype(np.int64): np.dtype(np.int32),
    np.dtype(np.uint64): np.dtype(np.uint32),
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.complex128): np.dtype(np.complex64),
}

# The dtypes `convert` carries between frameworks: every one of them exists in NumPy, torch
# and JAX. Anything else (float8 and int4 types, complex32, strings, objects, records,
# datetimes, quantized ints) is refused by name rather than passed through half-converted.
CARRIED_NAMES = dtypes.CARRIED_NAMES  # the table's rows: dualtrain.dtypes


def dtypes_named(names: frozenset[str]) -> frozenset[np.dtype]:
    """NumPy dtypes for dtype names (``"bfloat16"`` through ml_dtypes)."""
    return frozenset(dtypes.numpy_dtype(name) for name in names)


CARRIED: frozenset[np.dtype] = dtypes_named(CARRIED_NAMES)  # native byte order only

_KINDS = {"O": "object", "U": "str", "S": "bytes", "V": "structured", "M": "datetime"} | {
    "m": "timedelta"
}


def describe_dtype(dtype: np.dtype) -> str:
    """``"a str array (dtype <U3)"``: what an array of `dtype` is, for refusals."""
    kind = _KINDS.get(dtype.kind)
    if dtype.kind == "V" and dtype.names is None and not dtype.name.startswith("void"):
        kind = None  # ml_dtypes' types (float8_e4m3fn, int4) are kind "V" too
    if kind is not None:
        return f"a{'n' if kind[0] in 'aeiou' else ''} {kind} array (dtype {dtype.str})"
    if dtype.byteorder not in "=|" and dtype.newbyteorder("=") != dtype:
        return f"an array of dtype {dtype.str} (non-native byte order)"
    return f"an array of dtype {dtype.name}"


def canonical_strides(a: np.ndarray) -> np.ndarray:
    """`a` itself, or a view of the same memory whose unused strides are row-major ones.

    No element is ever reached through the stride of a size-1 axis, nor through any stride of
    an empty array, so those strides may be anything (odd, negative, huge); frameworks refuse
    some of them (torch: strides not a multiple of the itemsize; DLPack: negative ones). They
    are rewritten here, which shares the memory and changes no value.
    """
    shape, strides = a.shape, a.strides
    if a.size and 1 not in shape:
        return a
    expected, canonical = a.itemsize, []
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        canonical.append(s if a.size and n != 1 else expected)
        expected *= max(n, 1)
    canonical.reverse()
    if tuple(canonical) == strides:
        return a
    if a.size == 0:  # no memory is read: a fresh empty array is the same value
        return np.empty(shape, a.dtype)
    return np.lib.stride_tricks.as_strided(a, strides=canonical)  # read-only stays read-only


def describe_layout(a: np.ndarray) -> str:
    """``"shape (3, 1), strides (4, 3) bytes, itemsize 4"``: an array's layout, for messages."""
    return f"shape {a.shape}, strides {a.strides} bytes, itemsize {a.itemsize}"


def copy_reason(a: np.ndarray, dst: Any) -> str | None:
    """Why host array `a` cannot be handed to backend `dst` as it is, or None if it can.

    `a` has canonical strides (`canonical_strides`): only strides that address elements count.
    """
    if dst.name == "numpy":
        return None
    if a.size and min(a.strides, default=0) < 0:
        return f"it has negative strides ({describe_layout(a)})"
    if a.size and any(s % a.itemsize for s in a.strides):  # DLPack counts strides in elements
        return f"its strides are not multiples of its itemsize ({describe_layout(a)})"
    if a.size and dst.compact_only and not a.flags.c_contiguous and not is_compact(a):
        return f"its strides leave gaps, and it takes compact arrays only ({describe_layout(a)})"
    if dst.host_alignment > 1 and a.size and a.ctypes.data % dst.host_alignment:
        return f"its data is not {dst.host_alignment}-byte aligned"
    if not a.flags.writeable and not dst.takes_readonly_host:
        return "it is read-only, and DLPack cannot hand read-only buffers to it"
    return None


def is_compact(a: np.ndarray) -> bool:
    """Whether `a` fills its memory without gaps in some axis order (a permuted C layout)."""
    expected = a.itemsize
    for stride, size in sorted(zip(a.strides, a.shape, strict=True)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True
