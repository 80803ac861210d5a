"""What `DashBoard.gauge` takes as a metric's value, and how it keeps it until the next read.

Host values (Python and NumPy numbers, NumPy arrays) are read at once: reading them costs
nothing and a buffer the caller reuses would otherwise be seen with its last value. A torch
tensor is kept as a detached copy made on its own device (``detach().clone()``: queued, no
sync), so neither an in-place update nor its autograd graph reaches the dashboard. A JAX
array is immutable and kept as it is. Device values are read together at the next read.
"""

from __future__ import annotations

import math
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
    kind = type(value)
    if kind is float or kind is int:  # the common cases first: gauge runs every step
        return float(value)
    way = _WAYS.get(kind)
    if way is None:
        way = _WAYS[kind] = _way_of(value)
    if way == "host":
        if isinstance(value, (bool, np.bool_)):
            raise bad_argument(name, value, _EXPECTED + ", not a bool")
        return float(value)
    if way == "numpy":
        if value.size != 1 or value.dtype.kind not in "iuf":
            raise bad_argument(name, value, _EXPECTED)
        return float(value.reshape(()))
    if way == "bad" or math.prod(value.shape) != 1 or not _numeric(value.dtype):
        raise bad_argument(name, value, _EXPECTED)
    if way == "tracer":
        raise bad_argument(
            name, value, _EXPECTED + ": gauge outside jax.jit, with the value the step returns"
        )
    if way == "detach":  # a torch tensor: a copy queued on its device, no sync
        return value.detach().clone()
    return value  # a JAX array: immutable


def _way_of(value: Any) -> str:
    """How values of `value`'s type are kept (the answer is cached per type)."""
    if isinstance(value, (numbers.Real, bool, np.bool_)):
        return "host"
    if isinstance(value, np.ndarray):
        return "numpy"
    if getattr(value, "shape", None) is None or not hasattr(value, "item"):
        return "bad"
    if _is_tracer(value):
        return "tracer"
    if callable(getattr(value, "detach", None)) and callable(getattr(value, "clone", None)):
        return "detach"
    return "device"


_WAYS: dict[type, str] = {}
_NUMERIC: dict[Any, bool] = {}


def _numeric(dtype: Any) -> bool:
    """Whether a framework dtype is an int or float one (bool, complex, strings: no)."""
    known = _NUMERIC.get(dtype)
    if known is None:
        text = str(dtype)
        known = _NUMERIC[dtype] = ("float" in text or "int" in text) and "complex" not in text
    return known


def value_of(value: Any) -> float:
    """A kept value as a float (for a device value: the host read)."""
    return value if type(value) is float else float(value.item())


def _is_tracer(value: Any) -> bool:
    core = sys.modules.get("jax.core")
    tracer = getattr(core, "Tracer", None) if core is not None else None
    return tracer is not None and isinstance(value, tracer)
