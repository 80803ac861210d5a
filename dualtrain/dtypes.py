"""The dtype-name table: one row per dtype dualtrain knows, by name.

Each row gives a dtype's name (NumPy's, which torch and JAX share: ``"bfloat16"``), its
NumPy dtype (bfloat16 and the float8 types through ml_dtypes, a core dependency), its
safetensors code (``"BF16"``, None where safetensors has none), its size in bytes and its
kind (``"bool"``, ``"int"``, ``"uint"``, ``"float"``, ``"complex"``). Every module that needs a
dtype by name, a safetensors code, or "float or int" asks here, so the names cannot drift.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "BY_CODE",
    "BY_NAME",
    "CARRIED_NAMES",
    "FLOAT_NAMES",
    "STORED_NAMES",
    "TABLE",
    "DtypeInfo",
    "code_of",
    "kind",
    "name_of",
    "numpy_dtype",
]


@dataclasses.dataclass(frozen=True)
class DtypeInfo:
    """One row of the table.

    Attributes:
        name: the dtype's name (``"float32"``, ``"bfloat16"``).
        dtype: the NumPy dtype.
        code: the safetensors code (``"F32"``), or None where safetensors has none.
        kind: ``"bool"``, ``"int"``, ``"uint"``, ``"float"`` or ``"complex"``.
        carried: every framework has it (`dualtrain.convert` carries it between them).
    """

    name: str
    dtype: np.dtype
    code: str | None
    kind: str
    carried: bool = True

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize


def _row(name: str, code: str | None, kind: str, carried: bool = True) -> DtypeInfo:
    dtype = np.dtype(getattr(ml_dtypes, name) if hasattr(ml_dtypes, name) else name)
    return DtypeInfo(name, dtype, code, kind, carried)


TABLE: tuple[DtypeInfo, ...] = (
    _row("bool", "BOOL", "bool"),
    _row("uint8", "U8", "uint"),
    _row("int8", "I8", "int"),
    _row("uint16", "U16", "uint"),
    _row("int16", "I16", "int"),
    _row("uint32", "U32", "uint"),
    _row("int32", "I32", "int"),
    _row("uint64", "U64", "uint"),
    _row("int64", "I64", "int"),
    _row("float16", "F16", "float"),
    _row("bfloat16", "BF16", "float"),
    _row("float32", "F32", "float"),
    _row("float64", "F64", "float"),
    _row("float8_e4m3fn", "F8_E4M3", "float", carried=False),
    _row("float8_e5m2", "F8_E5M2", "float", carried=False),
    _row("complex64", None, "complex"),
    _row("complex128", None, "complex"),
)
BY_NAME: dict[str, DtypeInfo] = {row.name: row for row in TABLE}
# safetensors code -> NumPy dtype: what an anchor file may hold.
BY_CODE: dict[str, np.dtype] = {row.code: row.dtype for row in TABLE if row.code is not None}
_CODES: dict[np.dtype, str] = {dtype: code for code, dtype in BY_CODE.items()}

# Parameters' dtypes, in the order messages list them.
FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
# What `convert` carries between NumPy, torch and JAX.
CARRIED_NAMES = frozenset(row.name for row in TABLE if row.carried)
# What optimizer state in an anchor may hold: stored by safetensors, known to every framework.
STORED_NAMES = frozenset(row.name for row in TABLE if row.carried and row.code is not None)


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype named `name` (bfloat16 and float8 through ml_dtypes); else NumPy's.

    Raises:
        TypeError: NumPy knows no dtype of that name either.
    """
    row = BY_NAME.get(name)
    return row.dtype if row is not None else np.dtype(name)


def name_of(dtype: Any) -> str:
    """The table's name of a NumPy dtype or type, a torch or JAX dtype (``"bfloat16"``)."""
    if isinstance(dtype, str):
        text = dtype.removeprefix("torch.")
        if text in BY_NAME:
            return text
        try:
            return np.dtype(text).name  # NumPy's spellings: "f4" -> "float32"
        except TypeError:
            return text
    try:
        return np.dtype(dtype).name
    except TypeError:  # torch's dtypes are no NumPy dtypes: their str names them
        return str(dtype).removeprefix("torch.")


def code_of(dtype: np.dtype) -> str | None:
    """The safetensors code of `dtype` (any byte order), or None where it has none."""
    return _CODES.get(np.dtype(dtype).newbyteorder("="))


def kind(dtype: np.dtype) -> str:
    """``"float"``, ``"int"`` (signed or not) or ``"bool"``; another dtype's own name.

    Values cast within a kind (float32 <-> bfloat16), never across (float -> int).
    """
    row = BY_NAME.get(dtype.name)
    found = row.kind if row is not None else {"f": "float", "i": "int", "u": "int"}.get(dtype.kind)
    if dtype.name.startswith(("bfloat16", "float8")):  # ml_dtypes' other floats: kind "V"
        found = "float"
    if found in ("int", "uint"):
        return "int"
    if found in ("float", "bool"):
        return found
    return dtype.name
