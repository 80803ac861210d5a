"""Nebulae's ``nebulae.law.Constant``: the settings its code read (core, separators, dtypes)."""

from __future__ import annotations

__all__ = ["Constant"]


class Constant:
    """Nebulae's constants; ``CORE`` is torch's, the core its programs run on here."""

    CORE = "PYTORCH"
    FIELD_SEP = '"'
    CHAR_SEP = ","
    FRAME_KEY = "_MAX_FRAMES"
    VALID_DTYPE = ("uint8", "uint16", "uint32", "int8", "int16", "int32", "int64",
                   "float16", "float32", "float64", "str", "bool")  # fmt: skip
