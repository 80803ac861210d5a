"""Small helpers for tests that handle arrays of several frameworks."""

from __future__ import annotations

import sys

import numpy as np

import dualtrain

# Seconds a test waits for a child process it runs: a child that hangs fails its test,
# naming the command, instead of stalling the suite.
CHILD_TIMEOUT_S = 600


def address(x) -> int:
    """The data address of a NumPy, torch or JAX array."""
    name = dualtrain.backend_of(x).name
    if name == "torch":
        return int(x.data_ptr())
    if name == "jax":
        return int(x.unsafe_buffer_pointer())
    return int(np.asarray(x).ctypes.data)


def native(a: np.ndarray, framework: str):
    """An array of `framework` holding a fresh copy of `a` (aligned, contiguous)."""
    if (
        framework == "jax"
        and a.dtype.name in ("int64", "uint64", "float64", "complex128")
        and not _x64()
    ):
        raise AssertionError("64-bit JAX arrays need jax.enable_x64(True)")
    return dualtrain.convert(a, to=framework, copy=True)


def _x64() -> bool:
    jax = sys.modules.get("jax")
    return bool(jax and jax.config.read("jax_enable_x64"))
