"""What `DashBoard.gauge` takes as a metric's value, and how it keeps it until the next read.

Host values (Python and NumPy numbers, NumPy arrays) are read at once: reading them costs
nothing and a buffer the caller reuses would otherwise be seen with its last value. A torch
tensor is kept as a detached copy made on its own device (``detach().clone()``: queued, no
sync), so neither an in-place update nor its autograd graph reaches the dashboard. A JAX
array is immutable and kept as it is. Device values are read together at the next read.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["kept", "value_of"]

_EXPECTED = "a real number, or a one-element int or float torch tensor, JAX or NumPy array"


def kept(name: str, value: Any) -> Any:
    """`value` checked, as the dashboard keeps it: a float, or a device value to read later.

    Raises:
        ArgumentError: naming `name`: a bool, a non-numeric or complex dtype, more than one
            element, or a JAX tracer (gauge outside ``jax.jit``: a traced value has none).
    """
    if type(value) is float or type(value) is int:  # the common case, before the ABC checks
        return float(value)
    if isinstance(value, (bool, np.bool_)):
        raise bad_argument(name, value, _EXPECTED + ", not a bool")
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, np.ndarray):
        if value.size != 1 or value.dtype.kind not in "iuf":
            raise bad_argument(name, value, _EXPECTED)
        return float(value.reshape(()))
    shape, dtype = getattr(value, "shape", None), str(getattr(value, "dtype", ""))
    if shape is None or not hasattr(value, "item") or _size(shape) != 1:
        raise bad_argument(name, value, _EXPECTED)
    if "float" not in dtype and "int" not in dtype:  # bool, complex, strings
        raise bad_argument(name, value, _EXPECTED)
    if _is_tracer(value):
        raise bad_argument(
            name, value, _EXPECTED + ": gauge outside jax.jit, with the value the step returns"
        )
    detach = getattr(value, "detach", None)
    if callable(detach) and callable(getattr(value, "clone", None)):  # torch
        return detach().clone()
    return value


def value_of(value: Any) -> float:
    """A kept value as a float (for a device value: the host read)."""
    return value if type(value) is float else float(value.item())


def _size(shape: Any) -> int:
    size = 1
    for n in tuple(shape):
        size *= int(n)
    return size


def _is_tracer(value: Any) -> bool:
    core = sys.modules.get("jax.core")
    tracer = getattr(core, "Tracer", None) if core is not None else None
    return tracer is not None and isinstance(value, tracer)
