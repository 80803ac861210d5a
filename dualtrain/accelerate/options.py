"""The knobs of a ladder, validated once, shared by both adapters."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualtrain.errors import bad_argument

__all__ = ["LadderOptions"]


def _positive(name: str, value: Any, *, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kind)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise bad_argument(name, value, "a positive " + ("int" if integer else "number"))


@dataclass(frozen=True)
class LadderOptions:
    """How candidates are verified, timed and chosen.

    Attributes:
        rtol, atol: a candidate's outputs, parameter gradients and updated buffers must be
            within ``atol + rtol * max|eager|`` of eager's, element by element, the max
            taken over the arrays of the same kind: outputs, gradients or buffers
            (`dualtrain.accelerate.compare`); None picks by dtype
            (float32: rtol 1e-3, atol 1e-6; float64: 1e-9, 1e-12; bfloat16: 2e-2, 1e-3;
            float16: 1e-2, 1e-4; complex64 and complex128 as float32 and float64).
        compile_budget: seconds a candidate may take to compile and run its first batch;
            slower ones are rejected (the time is measured, not interrupted).
        warm_steps: timed steps per candidate after its first (the median is kept).
        min_speedup: a candidate replaces eager only if eager's median step time over its
            own is at least this (1.03: 3% above timing noise on a shared machine).
        max_signatures: input signatures decided per mode; beyond, calls run eager.
        budget: seconds the job is expected to run (its calls in one mode), or None. A job
            starts on the cheapest correct fast path (eager torch, ``jax.jit``) and tries a
            candidate only when it can win back its trial (`dualtrain.accelerate.payback`):
            with a budget, within what is left of it (``math.inf``: try every rung at the
            first call); without, within as long again as the job has run so far.
        cache: True (the default folder), False (no decision cache), or a folder.
        status: whether a climb expected to take a second or more during the job says so
            on stderr, one line before (rung, elapsed, expected build) and one after.
        clock: seconds, as `time.perf_counter` (the default) reads them: what times each
            compile and step. A seam for tests, which pass a fake clock so that a verdict
            on speed does not depend on how busy the machine is.
    """

    rtol: float | None = None
    atol: float | None = None
    compile_budget: float = 120.0
    warm_steps: int = 5
    min_speedup: float = 1.03
    max_signatures: int = 8
    budget: float | None = None
    cache: bool | str | os.PathLike[str] = True
    status: bool = True
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise bad_argument(name, value, "None or a finite number >= 0")
        _positive("compile_budget", self.compile_budget)
        _positive("warm_steps", self.warm_steps, integer=True)
        _positive("min_speedup", self.min_speedup)
        _positive("max_signatures", self.max_signatures, integer=True)
        if self.budget is not None and (
            isinstance(self.budget, bool)
            or not isinstance(self.budget, (int, float))
            or math.isnan(self.budget)
            or self.budget <= 0
        ):
            raise bad_argument("budget", self.budget, "None or a number of seconds > 0 (inf too)")
        if not isinstance(self.cache, (bool, str, os.PathLike)) or self.cache == "":
            # "" would be the working directory: a cache spread over the user's project.
            raise bad_argument("cache", self.cache, "True, False or a non-empty folder path")
        if not isinstance(self.status, bool):
            raise bad_argument("status", self.status, "True or False")
        if not callable(self.clock):
            raise bad_argument(
                "clock", self.clock, "a callable returning seconds, like time.perf_counter"
            )

    @classmethod
    def from_keywords(cls, options: dict[str, Any]) -> LadderOptions:
        """The options from an adapter's ``**options``; an unknown keyword is named.

        Raises:
            ArgumentError: a keyword that is no field (the message lists the fields), or a
                field's bad value.
        """
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [name for name in options if name not in known]
        if unknown:
            raise bad_argument("options", unknown, f"keywords among {', '.join(known)}")
        return cls(**options)

    def folder(self) -> Path | None:
        """The decision cache's folder, or None when caching is off."""
        from dualtrain.accelerate.decisions import default_folder

        if self.cache is False:
            return None
        if self.cache is True:
            return default_folder()
        return Path(self.cache)

    def tolerance(self, dtype_name: str) -> tuple[float, float]:
        """(rtol, atol) for arrays of `dtype_name` ("float32", ...)."""
        rtol, atol = _TOLERANCES.get(dtype_name, (1e-3, 1e-6))
        return (
            rtol if self.rtol is None else float(self.rtol),
            atol if self.atol is None else float(self.atol),
        )


# Compiled kernels reorder floating sums (fusions, vectorized reductions), so equality is
# within a few ulps scaled by the depth of the computation, not bit for bit.
_TOLERANCES = {
    "float64": (1e-9, 1e-12),
    "float32": (1e-3, 1e-6),
    "bfloat16": (2e-2, 1e-3),
    "float16": (1e-2, 1e-4),
    # a complex number is two floats of half its width
    "complex128": (1e-9, 1e-12),
    "complex64": (1e-3, 1e-6),
}
