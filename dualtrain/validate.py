"""Argument checks shared by every public function: seeds, ints, finite numbers, dtypes.

Each raises the house `ArgumentError` (or `DtypeError`) naming the argument, the value
received and what was expected. Python bools are refused wherever a number is expected
(``True`` is an int to Python, never a meaningful count or seed); NumPy integer and float
scalars are accepted like Python's.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from dualtrain import dtypes
from dualtrain.errors import DtypeError, bad_argument

__all__ = [
    "FLOAT_DTYPES",
    "SEED_LIMIT",
    "check_finite",
    "check_float_dtype",
    "check_int",
    "check_seed",
]

SEED_LIMIT = 2**64  # seeds are ints in [0, 2**64): every one names its own random streams
FLOAT_DTYPES = dtypes.FLOAT_NAMES


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_seed(name: str, value: object) -> int:
    """`value` as a Python int in ``[0, 2**64)``; refuses bools, floats and other types.

    Seeds outside the range are refused rather than reduced, so two different seeds never
    give the same numbers.
    """
    if not _is_int(value) or not 0 <= int(value) < SEED_LIMIT:  # type: ignore[call-overload]
        raise bad_argument(name, value, "an int in [0, 2**64)")
    return int(value)  # type: ignore[call-overload]


def check_int(
    name: str, value: object, minimum: int | None = None, maximum: int | None = None
) -> int:
    """`value` as a Python int within ``[minimum, maximum]`` (bounds optional); no bools."""
    ok = _is_int(value)
    if ok and minimum is not None:
        ok = int(value) >= minimum  # type: ignore[call-overload]
    if ok and maximum is not None:
        ok = int(value) <= maximum  # type: ignore[call-overload]
    if not ok:
        if minimum is not None and maximum is not None:
            expected = f"an int in [{minimum}, {maximum}]"
        elif minimum == 1:
            expected = "a positive int"
        elif minimum == 0:
            expected = "a non-negative int"
        elif minimum is not None:
            expected = f"an int >= {minimum}"
        elif maximum is not None:
            expected = f"an int <= {maximum}"
        else:
            expected = "an int"
        raise bad_argument(name, value, expected)
    return int(value)  # type: ignore[call-overload]


def check_finite(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    expected: str | None = None,
) -> float:
    """`value` as a finite Python float within the bounds given; no bools, NaN or inf.

    Args:
        name: the argument's name, for the message.
        value: what was passed (an int or float, Python or NumPy).
        low: the smallest value allowed (excluded when `low_open`).
        high: the largest value allowed (excluded when `high_open`).
        low_open: whether `low` itself is refused.
        high_open: whether `high` itself is refused.
        expected: what the message says is expected; by default built from the bounds.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    number = float(value) if ok else math.nan  # type: ignore[arg-type]
    ok = ok and math.isfinite(number)
    if ok and low is not None:
        ok = number > low if low_open else number >= low
    if ok and high is not None:
        ok = number < high if high_open else number <= high
    if not ok:
        if expected is None:
            lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
            hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
            expected = (
                "a finite number"
                + (f" {lo}" if lo else "")
                + (f"{' and' if lo else ''} {hi}" if hi else "")
            )
        raise bad_argument(name, value, expected)
    return number


def check_float_dtype(name: str, value: Any) -> np.dtype:
    """`value` (a name, NumPy/JAX dtype or type, or a torch dtype) as a floating NumPy dtype.

    Parameters need a floating dtype: an integer or bool dtype would turn every initial
    value into 0, so it is refused with a `DtypeError`.
    """
    text = str(value).removeprefix("torch.")
    try:
        dtype = None if value is None else np.dtype(value)  # np.dtype(None) is float64
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in FLOAT_DTYPES:
        if dtype is None and text in FLOAT_DTYPES:  # bfloat16 through ml_dtypes
            return dtypes.numpy_dtype(text)
        raise DtypeError(f"{name} must be one of {FLOAT_DTYPES}; got {name}={value!r}")
    return dtype
