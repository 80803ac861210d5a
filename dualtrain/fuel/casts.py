"""Casts: how a Tank serves each data_specf column, and the checks of each narrowing.

The dtype checks of `data_specf` against the pack (str or numeric, image depth, a narrowing
`cast` allows, float64 under JAX without x64), the cast modes, the per-value check of a
checked cast, and the hint naming the options that work for a refused one.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dualtrain.backend_contract import Backend
from dualtrain.errors import DtypeError, PackError, bad_argument
from dualtrain.fuel.columns import ColumnType
from dualtrain.fuel.pack import Pack

_CASTS = ("safe", "same_kind", "unsafe")


def check_floats(spec: dict[str, Served], backend: Backend) -> None:
    """Refuses float64 columns for a backend without 64-bit dtypes now (JAX without x64).

    It would hand them over as float32, turning 1e300 into inf, where every other narrowing
    Fuel serves is asked for and checked.
    """
    if backend.supports_x64():
        return
    wide = [k for k, served in spec.items() if served.base != "str" and served.dtype == np.float64]
    if wide:
        raise DtypeError(
            f"data_specf serves {wide} as float64, but JAX runs without x64 and would narrow "
            f"them to float32 unchecked. Serve them as float32 with cast='same_kind' (each "
            "value checked: one that overflows is a PackError), or enable x64 first: "
            "jax.config.update('jax_enable_x64', True)"
        )


def check_spec(
    pack: Pack, spec: Mapping[str, str], cast: str | Mapping[str, str]
) -> dict[str, Served]:
    """How each `data_specf` column is served, its dtype and `cast` checked against `pack`."""
    if not isinstance(spec, Mapping) or not spec:
        raise bad_argument("data_specf", spec, "a non-empty dict of column key -> dtype")
    casts = dict(cast) if isinstance(cast, Mapping) else None
    if casts is None and cast not in _CASTS:
        raise bad_argument("cast", cast, f"one of {_CASTS}, or a dict key -> one of them")
    for key, how in (casts or {}).items():
        if key not in spec or how not in _CASTS:
            raise bad_argument(f"cast[{key!r}]", how, f"one of {_CASTS}, for a data_specf key")
    out: dict[str, Served] = {}
    for key, dtype in spec.items():
        if key not in pack.columns:
            raise bad_argument("data_specf", dict(spec), f"keys among the pack's {pack.keys}")
        ctype = ColumnType.parse(dtype, f"data_specf[{key!r}]")
        kind = pack.columns[key]["kind"]
        stored = ColumnType.parse(pack.columns[key]["type"])
        how = casts.get(key, "safe") if casts is not None else str(cast)
        if kind in ("image", "sequence"):
            depth = str(pack.image.get("dtype", "uint8"))  # packs before depths: uint8
            if ctype.base != depth:
                raise bad_argument(
                    f"data_specf[{key!r}]", dtype,
                    f"{depth!r} for an image column (the pack's depth; scale= gives float32)",
                )  # fmt: skip
        elif (ctype.base == "str") != (stored.base == "str"):
            raise DtypeError(
                f"data_specf[{key!r}]={dtype!r}: column {key!r} is stored as {stored.name!r}; "
                "a str column is served as 'str' and a numeric one as a numeric dtype"
            )
        elif ctype.base != "str" and not np.can_cast(stored.dtype, ctype.dtype, how):  # type: ignore[arg-type]
            raise DtypeError(
                f"data_specf[{key!r}]={dtype!r} narrows column {key!r}, stored as "
                f"{stored.dtype}: {stored.dtype} -> {ctype.dtype} can lose values. "
                + _cast_hint(key, stored.dtype, ctype.dtype)
            )
        checked = ctype.base != "str" and _needs_check(stored.dtype, ctype.dtype, how)
        out[key] = Served(ctype, stored.dtype, checked)
    return out


class Served:
    """How one column is served: its type, stored dtype, and whether each value is checked."""

    def __init__(self, ctype: ColumnType, stored: np.dtype, checked: bool) -> None:
        self.ctype, self.stored, self.checked = ctype, stored, checked

    @property
    def base(self) -> str:
        return self.ctype.base

    @property
    def dtype(self) -> np.dtype:
        return self.ctype.dtype


def check_value(key: str, index: int, stored: np.ndarray, out: np.ndarray) -> None:
    """A cast kept every value: integers exactly, floats without overflow.

    Values are compared, not round-tripped through casts: uint8 200 as int8 is -56, which
    casts back to 200. Integers are compared as Python ints (exact for every width); an
    integer served as a float must be that float exactly (2**53 + 1 as float64 is not).
    """
    if out.dtype.kind in "iub":
        info = np.iinfo(out.dtype) if out.dtype.kind != "b" else None
        low, high = (int(info.min), int(info.max)) if info is not None else (0, 1)
        lost = [v for v in stored.ravel().tolist() if not low <= int(v) <= high]
    elif stored.dtype.kind in "iub":
        lost = [
            v for v, o in zip(stored.ravel().tolist(), out.ravel().tolist(), strict=True) if v != o
        ]
    else:
        lost = np.ravel(stored[np.isinf(out) & np.isfinite(stored)]).tolist()
    if lost:
        raise PackError(
            f"column {key!r}, row {index}: the stored {stored.dtype} value {lost[0]!r} does "
            f"not fit {out.dtype} (it would be served changed)"
        )


def first_lost(rows: np.ndarray, stored: np.ndarray, out: np.ndarray) -> int | None:
    """The position in the batch of the first row whose cast lost a value, or None.

    `check_value` for a batch, vectorized: ``stored[j]`` is row ``rows[j]``, ``out`` its
    cast; `check_value` on that row raises the error a row-by-row read gives.
    """
    if out.dtype.kind in "iub" and stored.dtype.kind in "iub":
        # The target's bounds clipped to the stored type's: exact in the stored dtype.
        have = np.iinfo(stored.dtype) if stored.dtype.kind != "b" else None
        want = np.iinfo(out.dtype) if out.dtype.kind != "b" else None
        low = max(0 if want is None else int(want.min), 0 if have is None else int(have.min))
        high = min(1 if want is None else int(want.max), 1 if have is None else int(have.max))
        values = stored.astype(np.int8) if have is None else stored
        lost = (values < values.dtype.type(low)) | (values > values.dtype.type(high))
    elif stored.dtype.kind in "iu":  # integers served as floats must be those floats exactly
        with np.errstate(invalid="ignore", over="ignore"):
            lost = out.astype(stored.dtype) != stored
        # The stored bounds (the maximum + 1, a power of two) are exact as floats: a value
        # beyond them (an overflow to inf included) is a loss however the conversion back
        # saturates or wraps.
        info, wide = np.iinfo(stored.dtype), out.astype(np.float64)
        lost |= (wide >= float(int(info.max) + 1)) | (wide < float(int(info.min)))
    elif out.dtype.kind in "iub" or stored.dtype.kind == "b":
        for j, row in enumerate(rows.tolist()):  # no cast that `cast=` checks comes here
            try:
                check_value("", int(row), stored[j], out[j])
            except PackError:
                return j
        return None
    else:
        lost = np.isinf(out) & np.isfinite(stored)
    if not lost.any():
        return None
    return int(np.argmax(lost.reshape(len(rows), -1).any(axis=1)))


def _cast_hint(key: str, stored: np.dtype, wanted: np.dtype) -> str:
    """What to pass instead: only options that work for this pair of dtypes."""
    serve = [str(stored)]
    wider = np.promote_types(stored, wanted)
    if wider != stored and np.can_cast(stored, wider, "safe") and wider.kind == wanted.kind:
        serve.append(str(wider))
    hint = f"Serve it as {' or '.join(serve)}, or allow it: "
    if np.can_cast(stored, wanted, "same_kind"):
        return hint + f"cast={{{key!r}: 'same_kind'}} (checked per value) or 'unsafe' (unchecked)"
    return hint + (
        f"cast={{{key!r}: 'unsafe'}} (NumPy's astype, unchecked: {stored} -> {wanted} is "
        "not a same-kind cast)"
    )


def _needs_check(stored: np.dtype, wanted: np.dtype, how: str) -> bool:
    """Whether a cast that `how` allows can change a value, so each one is checked."""
    if how == "unsafe":
        return False
    if stored.kind in "iu" and wanted.kind == "f":
        # int64 as float64 is "safe" to NumPy, yet 2**53 + 1 has no float64.
        return stored.itemsize * 8 - (stored.kind == "i") > np.finfo(wanted).nmant + 1
    return not np.can_cast(stored, wanted, "safe")
