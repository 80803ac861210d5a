"""Column types of a pack and the parsing of CSV cells into them.

A column type is a NumPy dtype name (``"uint8"`` ... ``"int64"``, ``"float16/32/64"``,
``"bool"``), ``"str"``, or one of these with a ``"v"`` prefix (``"vfloat32"``) for cells
whose length varies from row to row. A cell holding commas (``"1,2,3"``) is an array; a
fixed column's cells must then all have the same length.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

from dualtrain.errors import DtypeError, bad_argument

__all__ = ["ColumnType", "parse_cell"]

_NUMERIC = (
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
)
# The strict grammar of numeric cells: ASCII digits only (Python's int() and float() also
# take "1_000", Arabic-Indic digits, "nan", "inf" and Unicode spaces, none of which a CSV
# of numbers means), an optional sign, and for floats a decimal point and an exponent.
INT_GRAMMAR = re.compile(r"[+-]?[0-9]+", re.ASCII)
FLOAT_GRAMMAR = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_BLANKS = " \t"  # the spaces a cell's parts may have around them ("1, 2, 3")
_TRUE = ("1", "true", "True", "TRUE")
_FALSE = ("0", "false", "False", "FALSE")


@dataclasses.dataclass(frozen=True)
class ColumnType:
    """A parsed column type.

    Attributes:
        name: the type as written (``"vuint8"``).
        base: the element dtype name (``"uint8"``), or ``"str"``.
        variable: True for ``v``-prefixed types and ``"str"``: stored as offsets + values.
    """

    name: str
    base: str
    variable: bool

    @classmethod
    def parse(cls, name: object, argument: str = "dtype") -> ColumnType:
        """``ColumnType.parse("vfloat32")``; raises ArgumentError naming `argument`."""
        if not isinstance(name, str):
            raise bad_argument(argument, name, f"a column type, one of {_names()}")
        base = name[1:] if name.startswith("v") else name
        if base not in (*_NUMERIC, "str") or name == "vstr":
            raise bad_argument(argument, name, f"a column type, one of {_names()}")
        return cls(name, base, variable=name != base or base == "str")

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of the stored values (UTF-8 bytes for ``"str"``)."""
        return np.dtype(np.uint8 if self.base == "str" else self.base)


def _names() -> str:
    return ", ".join((*_NUMERIC, "str")) + " (a 'v' prefix for variable length)"


def parse_cell(text: str, ctype: ColumnType) -> Any:
    """Parses one CSV cell into a value of `ctype`.

    Returns:
        A NumPy scalar or 1-D array of ``ctype.dtype``, or a str for ``"str"``.

    Raises:
        DtypeError: the text is not a value of the type, or does not fit it (``300`` as
            uint8, ``1e40`` as float16); the message says which part failed.
    """
    if ctype.base == "str":
        return text
    parts = [p.strip(_BLANKS) for p in text.split(",")] if text.strip(_BLANKS) else []
    if not ctype.variable and len(parts) == 0:
        raise DtypeError(f"an empty cell is not a {ctype.base}")
    values = np.empty(len(parts), dtype=ctype.dtype)
    for i, part in enumerate(parts):
        values[i] = _parse_scalar(part, ctype.base)
    if ctype.variable or len(parts) > 1:
        return values
    return values[0]


def _parse_scalar(text: str, base: str) -> Any:
    if base == "bool":
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise DtypeError(f"{text!r} is not a bool (expected one of 0, 1, true, false)")
    if base.startswith(("int", "uint")):
        if not INT_GRAMMAR.fullmatch(text):
            raise DtypeError(f"{text!r} is not an integer (ASCII digits with an optional sign)")
        value = int(text)
        info = np.iinfo(base)
        if not info.min <= value <= info.max:
            raise DtypeError(f"{text!r} does not fit {base} [{info.min}, {info.max}]")
        return value
    if not FLOAT_GRAMMAR.fullmatch(text):
        raise DtypeError(
            f"{text!r} is not a number (ASCII digits with an optional sign, decimal point "
            "and exponent; no nan or inf)"
        )
    value_f = float(text)
    finfo = np.finfo(base)
    if not math.isfinite(value_f) or abs(value_f) > float(finfo.max):
        raise DtypeError(f"{text!r} does not fit {base} (finite, at most {float(finfo.max):g})")
    return value_f
