"""A decision's steady timing: recorded by the run that decided, checked by the runs after.

A cached decision is served without trials, so a decision taken on a busy machine (or a
quiet one, read on a busy one) would hold for good. The run that decides watches its
first calls under the decided runner and records their steady time between calls, with
its spread (`Steady`). A later run served from the cache watches as many of its own
calls; only when their steady time contradicts the record beyond the decision's margin
(`margin`, `contradiction`) are the decision's rivals tried again, each by its expected
payback; within the margin nothing is re-decided (no churn under load).

Time between calls is what a job's wall clock sees (data, loss and optimizer included):
it is the same quantity in both runs of one job, whatever the framework dispatches
asynchronously. Everything here is arithmetic on numbers handed in, tested with fake
clocks.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FLOOR", "SKIP", "WINDOW", "Steady", "contradiction", "margin", "steady_of"]

SKIP = 2  # intervals left out first: the calls that build, warm up and page in
WINDOW = 24  # intervals whose median is the steady time
# The least margin: two runs of one job on one machine differ by this much without
# anything changing that a re-decision could fix (bench_jobs' ladder job, 10 alternated
# pairs on this 2-core machine: its p10-p90 ratios spread 0.78-1.31, docs/benchmarks.md).
FLOOR = 0.25


@dataclass(frozen=True)
class Steady:
    """The steady time between a mode's calls.

    Attributes:
        ms: the median milliseconds between consecutive calls over the window.
        spread: the interquartile range over that median (0.1: the middle half of the
            intervals lies within 10% of the median's size).
    """

    ms: float
    spread: float


def steady_of(intervals_s: Sequence[float]) -> Steady:
    """The steady time of `intervals_s` (seconds between calls, in order).

    The first `SKIP` are left out; at most `WINDOW` after them are read.

    Raises:
        ValueError: fewer than ``SKIP + 2`` intervals, or a negative one.
    """
    window = list(intervals_s[SKIP : SKIP + WINDOW])
    if len(window) < 2:
        raise ValueError(f"intervals_s: {len(intervals_s)} given, at least {SKIP + 2} expected")
    if min(window) < 0:
        raise ValueError(f"intervals_s: {min(window)} s given, intervals of >= 0 s expected")
    middle = statistics.median(window)
    q1, _, q3 = statistics.quantiles(window, n=4, method="inclusive")
    return Steady(middle * 1e3, (q3 - q1) / middle if middle > 0 else 0.0)


def margin(recorded: Steady, now: Steady, choice_low: float | None = None) -> float:
    """How far (a fraction) the steady time may move before the decision is in doubt.

    The largest of `FLOOR`, either window's spread and, for a rung chosen over the start,
    its lower-quartile speed-up over the start less one (`choice_low`, what the pairs that
    chose it showed at worst: running that much slower, it would still have beaten the
    start as the start ran then).
    """
    widest = max(FLOOR, recorded.spread, now.spread)
    if choice_low is not None and choice_low > 1.0:
        widest = max(widest, choice_low - 1.0)
    return widest


def contradiction(recorded: Steady, now: Steady, allowed: float) -> float | None:
    """``now.ms / recorded.ms`` when it lies beyond ``1 + allowed`` either way, else None.

    Slower or faster both contradict: a decision taken under load is in doubt when the
    machine is quiet, as one taken quiet is under load.
    """
    if recorded.ms <= 0:
        return None
    ratio = now.ms / recorded.ms
    if ratio > 1.0 + allowed or ratio < 1.0 / (1.0 + allowed):
        return ratio
    return None
