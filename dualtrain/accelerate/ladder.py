"""The ladder: verify each candidate against eager on one real batch, time it, keep the fastest.

Framework-neutral: an adapter hands in `Trial` objects (one per rung) that know how to build
their runner, run the batch side-effect free and time a step; this module decides. Eager is
the reference and the default: a candidate replaces it only when it is correct (outputs,
gradients and updated buffers within tolerance, `dualtrain.accelerate.compare`), compiled
within the budget, and measurably faster.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from dualtrain.accelerate.compare import compare
from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import (
    CHOSEN,
    FAILED,
    REJECTED,
    UNAVAILABLE,
    VERIFIED,
    Attempt,
    over_label,
)

__all__ = [
    "Trial",
    "UnavailableError",
    "alternated",
    "climb",
    "describe_error",
    "median_time",
    "speedup_of",
]


class UnavailableError(Exception):
    """A rung cannot run here (a missing package, no CUDA, nothing to apply it to)."""


class Trial(Protocol):
    """One rung, ready to be tried on the batch in hand.

    ``check`` and ``step`` must leave no trace: the adapter restores parameters, buffers,
    optimizer state and RNG around them.
    """

    name: str

    def build(self) -> None:
        """Prepares the runner (compiles lazily or not); raises `UnavailableError` if it cannot."""

    def check(self) -> tuple[list[str], list[np.ndarray]]:
        """Runs the batch once; returns names and host copies of outputs, grads, buffers."""

    def step(self) -> float | None:
        """One step (blocking until the device is done), timed whole unless it says.

        It may return its own seconds: what a real call costs, without the restoring that
        only a trial does.
        """

    def release(self) -> None:
        """Undoes what `build` changed when the rung is not kept (a layout, a compile)."""


def median_time(
    step: Callable[[], float | None],
    steps: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median seconds of `steps` calls of `step` (after the calls already made).

    A call that returns a number of seconds counts that instead of the time `clock` saw
    pass.
    """
    times = []
    for _ in range(steps):
        start = clock()
        measured = step()
        wall = clock() - start
        times.append(measured if isinstance(measured, (int, float)) else wall)
    return statistics.median(times)


def describe_error(error: BaseException) -> str:
    """``Type: first line of the message`` (compilers' messages run to pages)."""
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first[:300]}"


def alternated(
    reference: Callable[[], float | None],
    candidate: Callable[[], float | None],
    pairs: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[float], list[float]]:
    """Seconds of `pairs` steps of each, alternated (reference, candidate, reference, ...).

    Alternating puts both under the same load: a burst on a shared machine slows a pair, not
    one side. A step that returns seconds counts those (see `median_time`).
    """
    ref: list[float] = []
    cand: list[float] = []
    for _ in range(pairs):
        ref.append(median_time(reference, 1, clock))
        cand.append(median_time(candidate, 1, clock))
    return ref, cand


def speedup_of(ref: Sequence[float], cand: Sequence[float]) -> tuple[float, float]:
    """(median speed-up, its lower quartile over the pairs) of alternated samples.

    The median is eager's median over the candidate's; the lower quartile is that of the
    pairs' own ratios: the margin a verdict has beyond the spread of its samples.
    """
    speedup = statistics.median(ref) / statistics.median(cand) if min(cand) > 0 else math.inf
    ratios = sorted(r / c if c > 0 else math.inf for r, c in zip(ref, cand, strict=True))
    low = ratios[(len(ratios) - 1) // 4]
    return speedup, low


def climb(
    reference: Trial, candidates: Sequence[Trial], options: LadderOptions
) -> tuple[str, list[Attempt]]:
    """Tries `candidates` in order against `reference`; returns the chosen name and attempts.

    The reference is built, checked and timed only when a candidate gets that far (a
    ladder of rungs unavailable here costs nothing). Each verified candidate is timed in
    ``options.warm_steps`` pairs alternated with the reference; it is kept when its median
    speed-up is at least ``options.min_speedup`` and it was faster in at least three
    pairs in four (a margin beyond the samples' spread, `speedup_of`; with a
    ``min_speedup`` below 1, at least that fast in three pairs in four).

    An exception from the reference propagates (the user's model itself fails); a
    candidate's exception becomes a "failed" attempt. Compiles and steps are timed by
    ``options.clock``.
    """
    clock = options.clock
    truth: tuple[list[str], list[np.ndarray]] | None = None
    ref_times: list[float] = []
    ref_warm = False
    attempts: list[Attempt] = []
    best: int | None = None  # the index of the fastest verified attempt so far

    def want() -> tuple[list[str], list[np.ndarray]]:
        nonlocal truth
        if truth is None:
            reference.build()
            truth = reference.check()
        return truth

    for trial in candidates:
        start = clock()
        try:
            trial.build()
        except UnavailableError as why:
            attempts.append(Attempt(trial.name, UNAVAILABLE, str(why)))
            trial.release()
            continue
        except Exception as error:  # a compiler's failure is the ladder's information
            attempts.append(
                Attempt(trial.name, FAILED, describe_error(error), compile_s=clock() - start)
            )
            trial.release()
            continue
        built_s = clock() - start
        names, wanted = want()  # the reference's run is not the candidate's compile time
        start = clock()
        try:
            got_names, got = trial.check()
        except UnavailableError as why:
            attempts.append(Attempt(trial.name, UNAVAILABLE, str(why)))
            trial.release()
            continue
        except Exception as error:
            attempts.append(
                Attempt(
                    trial.name,
                    FAILED,
                    describe_error(error),
                    compile_s=built_s + clock() - start,
                )
            )
            trial.release()
            continue
        compile_s = built_s + clock() - start
        verdict = compare(names, wanted, got, options)
        if got_names != names:
            verdict = type(verdict)(False, verdict.max_error, "results named differently")
        attempt = Attempt(trial.name, REJECTED, compile_s=compile_s, max_error=verdict.max_error)
        attempts.append(attempt)
        if not verdict.ok:
            attempt.reason = "differs from eager: " + verdict.reason
            trial.release()
            continue
        if compile_s > options.compile_budget:
            attempt.reason = (
                f"compiled in {compile_s:.1f} s, over the {options.compile_budget:g} s budget"
            )
            trial.release()
            continue
        try:
            if not ref_warm:
                reference.step()  # a warm step, as each candidate gets
                ref_warm = True
            trial.step()
            ref, cand = alternated(reference.step, trial.step, options.warm_steps, clock)
        except Exception as error:
            attempt.status, attempt.reason = FAILED, "while timed: " + describe_error(error)
            trial.release()
            continue
        ref_times.extend(ref)
        step_s = statistics.median(cand)
        attempt.step_ms = step_s * 1e3
        attempt.speedup, attempt.speedup_low = speedup_of(ref, cand)
        attempt.status = VERIFIED
        # The margin: faster in three pairs of four as well (a `min_speedup` below 1 says
        # slower is welcome, and asks no margin beyond it).
        margin = min(1.0, options.min_speedup)
        if attempt.speedup < options.min_speedup or attempt.speedup_low < margin:
            attempt.status = REJECTED
            against = over_label(reference.name)  # what serves, on a later climb
            attempt.reason = (
                f"verified, but not {options.min_speedup:g}x faster than {against}"
                if attempt.speedup < options.min_speedup
                else f"verified, but slower than {against} in over a quarter of {len(cand)} "
                "alternated pairs (within the timing noise)"
            )
            trial.release()
            continue
        if best is None or attempt.speedup > attempts[best].speedup:  # type: ignore[operator]
            if best is not None:
                loser = attempts[best]
                loser.reason = "verified, slower than " + trial.name
                _release(candidates, loser.rung)
            best = len(attempts) - 1
        else:
            attempt.reason = "verified, slower than " + attempts[best].rung
            trial.release()
    eager_ms = statistics.median(ref_times) * 1e3 if ref_times else None
    eager = Attempt(reference.name, VERIFIED, "the reference", step_ms=eager_ms, speedup=1.0)
    if best is None:
        eager.status = CHOSEN
        eager.reason = "the reference; no candidate was verified and faster"
        return reference.name, [*attempts, eager]
    attempts[best].status = CHOSEN
    attempts[best].reason = "verified and fastest"
    return attempts[best].rung, [*attempts, eager]


def _release(candidates: Sequence[Trial], name: str) -> None:
    for trial in candidates:
        if trial.name == name:
            trial.release()
