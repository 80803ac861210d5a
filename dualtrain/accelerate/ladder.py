"""The ladder: verify each candidate against eager on one real batch, time it, keep the fastest.

Framework-neutral: an adapter hands in `Trial` objects (one per rung) that know how to build
their runner, run the batch side-effect free and time a step; this module decides. Eager is
the reference and the default: a candidate replaces it only when it is correct (outputs,
gradients and updated buffers within tolerance, `dualtrain.accelerate.compare`), compiled
within the budget, and measurably faster.
"""

from __future__ import annotations

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
)

__all__ = ["Trial", "UnavailableError", "climb", "describe_error", "median_time"]


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


def climb(
    reference: Trial, candidates: Sequence[Trial], options: LadderOptions
) -> tuple[str, list[Attempt]]:
    """Tries `candidates` in order against `reference`; returns the chosen name and attempts.

    An exception from the reference propagates (the user's model itself fails); a
    candidate's exception becomes a "failed" attempt. Compiles and steps are timed by
    ``options.clock``.
    """
    clock = options.clock
    reference.build()
    names, want = reference.check()
    reference.step()  # a warm step, as each candidate gets
    eager_s = median_time(reference.step, options.warm_steps, clock)
    attempts: list[Attempt] = []
    best: tuple[float, int] | None = None
    for trial in candidates:
        start = clock()
        try:
            trial.build()
            got_names, got = trial.check()
        except UnavailableError as why:
            attempts.append(Attempt(trial.name, UNAVAILABLE, str(why)))
            trial.release()
            continue
        except Exception as error:  # a compiler's failure is the ladder's information
            attempts.append(
                Attempt(
                    trial.name,
                    FAILED,
                    describe_error(error),
                    compile_s=clock() - start,
                )
            )
            trial.release()
            continue
        compile_s = clock() - start
        verdict = compare(names, want, got, options)
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
            trial.step()
            step_s = median_time(trial.step, options.warm_steps, clock)
        except Exception as error:
            attempt.status, attempt.reason = FAILED, "while timed: " + describe_error(error)
            trial.release()
            continue
        attempt.step_ms = step_s * 1e3
        attempt.speedup = eager_s / step_s if step_s > 0 else float("inf")
        attempt.status = VERIFIED
        if attempt.speedup < options.min_speedup:
            attempt.status = REJECTED
            attempt.reason = f"verified, but not {options.min_speedup:g}x faster than eager"
            trial.release()
            continue
        if best is None or step_s < best[0]:
            if best is not None:
                loser = attempts[best[1]]
                loser.reason = "verified, slower than " + trial.name
                _release(candidates, loser.rung)
            best = (step_s, len(attempts) - 1)
        else:
            attempt.reason = "verified, slower than " + attempts[best[1]].rung
            trial.release()
    eager = Attempt(reference.name, VERIFIED, "the reference", step_ms=eager_s * 1e3, speedup=1.0)
    if best is None:
        eager.status = CHOSEN
        eager.reason = "the reference; no candidate was verified and faster"
        return reference.name, [*attempts, eager]
    attempts[best[1]].status = CHOSEN
    attempts[best[1]].reason = "verified and fastest"
    return attempts[best[1]].rung, [*attempts, eager]


def _release(candidates: Sequence[Trial], name: str) -> None:
    for trial in candidates:
        if trial.name == name:
            trial.release()
