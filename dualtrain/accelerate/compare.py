"""Is a candidate's result eager's result? Element-wise, within a tolerance per dtype."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dualtrain.accelerate.options import LadderOptions
from dualtrain.dtypes import kind as dtype_kind

__all__ = ["Comparison", "compare"]


@dataclass(frozen=True)
class Comparison:
    """The verdict of `compare`: ``ok``, the worst excess and where it was."""

    ok: bool
    max_error: float  # the largest |got - want| over all arrays (0.0 when identical)
    reason: str = ""


def compare(
    names: Sequence[str],
    want: Sequence[np.ndarray],
    got: Sequence[np.ndarray],
    options: LadderOptions,
) -> Comparison:
    """Compares two lists of arrays named `names` (outputs, gradients, buffers).

    Shapes and dtypes must match exactly; NaN must sit where eager has NaN (and infinities
    match in sign); other elements must satisfy ``|got - want| <= atol + rtol * scale``
    where ``scale`` is the largest ``|want|`` among the arrays of the same kind (the part of
    the name before ``:`` or ``[``: outputs, gradients, buffers, parameters). A gradient is
    a sum of many terms, and a compiler that sums them in another order loses digits
    relative to the largest terms, not to the (possibly tiny, even zero) result: the bias
    of a convolution followed by BatchNorm has a true gradient of 0 and eager's is noise.
    A wrong computation (another mode, another dropout mask, a missed buffer update)
    differs by the values' own size.
    """
    if not len(names) == len(want) == len(got):
        return Comparison(False, math.inf, f"{len(got)} results where eager gave {len(want)}")
    worst = 0.0
    scales: dict[str, float] = {}
    for name, w in zip(names, want, strict=True):
        w = np.asarray(w)
        if _inexact(w.dtype) and w.size:
            finite = np.abs(w[np.isfinite(w)])
            top = float(finite.max()) if finite.size else 0.0
            scales[_kind(name)] = max(scales.get(_kind(name), 0.0), top)
    for name, w, g in zip(names, want, got, strict=True):
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape or w.dtype != g.dtype:
            return Comparison(
                False,
                math.inf,
                f"{name}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}",
            )
        if not _inexact(w.dtype):
            if not np.array_equal(w, g):
                return Comparison(False, math.inf, f"{name}: differs from eager")
            continue
        rtol, atol = options.tolerance(w.dtype.name)
        w64, g64 = (
            w.astype(np.complex128 if w.dtype.kind == "c" else np.float64),
            g.astype(np.complex128 if w.dtype.kind == "c" else np.float64),
        )
        same_special = np.isnan(w64) == np.isnan(g64)
        finite = np.isfinite(w64) & np.isfinite(g64)
        same_special &= np.where(np.isinf(w64) | np.isinf(g64), w64 == g64, True)
        if not same_special.all():
            return Comparison(False, math.inf, f"{name}: NaN or infinity where eager differs")
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: masked just below
            err = np.where(finite, np.abs(g64 - w64), 0.0)
        scale = scales.get(_kind(name), 0.0)
        excess = err - (atol + rtol * scale)
        if err.size:
            worst = max(worst, float(err.max()))
        if excess.size and float(excess.max()) > 0:
            at = np.unravel_index(int(np.argmax(excess)), excess.shape)
            return Comparison(
                False,
                worst,
                f"{name}: |error| {float(err[at]):.3g} at {tuple(int(i) for i in at)} exceeds "
                f"atol {atol:g} + rtol {rtol:g} * max |eager| ({scale:.3g})",
            )
    return Comparison(True, worst)


def _inexact(dtype: np.dtype) -> bool:
    # ml_dtypes' bfloat16 and float8 have NumPy kind "V"; they are floats all the same.
    return dtype.kind == "c" or dtype_kind(dtype) == "float"


def _kind(name: str) -> str:
    return name.split(":")[0].split("[")[0]
