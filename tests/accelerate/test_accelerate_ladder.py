"""The ladder (`climb`) with synthetic trials: plain objects that follow the `Trial` protocol.

Time is a fake clock (`LadderOptions.clock`) that a trial moves on by its own cost (1 ms,
2 ms, 5 ms for the reference, 15 ms a step; a compile of 80 ms), so the verdicts are the
same on an idle machine and a loaded one; correctness is what `check` returns.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.accelerate import LadderOptions, UnavailableError
from dualtrain.accelerate.ladder import climb, describe_error, median_time

NAMES = ["output[0]", "grad:w", "grad:b", "buffer:mean"]
WANT = [
    np.array([[0.5, -1.5], [2.0, 0.25]], np.float32),
    np.array([3.0, -4.0, 0.5], np.float32),
    np.zeros(2, np.float32),  # a true zero gradient: eager's is noise
    np.array([0.1, 0.2], np.float32),
]

EAGER_MS, FAST_MS, MID_MS, SLOW_MS = 5.0, 1.0, 2.0, 15.0


@dataclass
class FakeClock:
    """Seconds that pass only when a fake trial says its work took them."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Ticks:
    """A clock that moves one second at each reading: a time that counts what was timed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


# Shared by every fake trial and the options of these tests: it only moves forward, and
# the ladder reads differences, so tests cannot disturb one another through it.
CLOCK = FakeClock()


def results(kind: str, want: list[np.ndarray] = WANT) -> tuple[list[str], list[np.ndarray]]:
    """What a trial's check returns: eager's results, or a deliberate departure from them."""
    got = [w.copy() for w in want]
    names = list(NAMES[: len(want)])
    if kind == "right":
        # a compiler's reordering: a few ulps off, the zero gradient off by noise
        got[0] = got[0] * np.float32(1 + 1e-6)
        got[2] = got[2] + np.float32(1e-4)
    elif kind == "wrong":  # another dropout mask, another mode: off by the values' size
        got[0] = got[0] * np.float32(1.5)
    elif kind == "stale_buffer":  # a missed BatchNorm buffer update
        got[-1] = got[-1] * np.float32(0.9)
    elif kind == "nan":
        got[1] = got[1].copy()
        got[1][0] = np.nan
    elif kind == "renamed":
        names[1] = "grad:weight"
    elif kind == "short":
        names, got = names[:-1], got[:-1]
    elif kind == "reshaped":
        got[0] = got[0].reshape(-1)
    elif kind != "same":
        raise AssertionError(kind)
    return names, got


class FakeTrial:
    """A rung whose correctness, speed and failures are set by hand.

    Args:
        name: the rung's name.
        step_ms: how long each step takes (on `clock`).
        result: what `check` returns (see `results`).
        fail_in: "build", "check" or "step": that call raises.
        unavailable: `build` raises UnavailableError.
        build_s: how long `build` takes (a slow compile).
        want: eager's results for this batch.
        tag: what the runner returns besides the name (which call it serves).
        clock: the fake clock its work moves on.
    """

    def __init__(
        self,
        name: str,
        *,
        step_ms: float = FAST_MS,
        result: str = "right",
        fail_in: str | None = None,
        unavailable: bool = False,
        build_s: float = 0.0,
        want: list[np.ndarray] = WANT,
        tag: Any = None,
        clock: FakeClock = CLOCK,
    ) -> None:
        self.name, self.clock = name, clock
        self.step_ms, self.result, self.fail_in = step_ms, result, fail_in
        self.unavailable, self.build_s, self.want, self.tag = unavailable, build_s, want, tag
        self.calls: collections.Counter[str] = collections.Counter()

    def adopt(self, runner: Callable[..., Any]) -> None:
        self.calls["adopt"] += 1

    def build(self) -> None:
        if self.calls["adopt"]:
            return
        self.calls["build"] += 1
        if self.unavailable:
            raise UnavailableError(f"{self.name} needs a device this machine lacks")
        self.clock.advance(self.build_s)
        if self.fail_in == "build":
            raise RuntimeError(f"{self.name} cannot compile\nsecond line of a long trace")

    def check(self) -> tuple[list[str], list[np.ndarray]]:
        self.calls["check"] += 1
        if self.fail_in == "check":
            raise ValueError(f"{self.name} crashed on the batch")
        return results(self.result, self.want)

    def step(self) -> None:
        self.calls["step"] += 1
        if self.fail_in == "step":
            raise RuntimeError(f"{self.name} failed in a timed step")
        self.clock.advance(self.step_ms / 1e3)

    def release(self) -> None:
        self.calls["release"] += 1

    def runner(self) -> Callable[..., Any]:
        assert self.calls["build"] or self.calls["adopt"], "build() first"
        name, tag = self.name, self.tag

        def run(*args: Any) -> tuple[str, Any]:
            return name, tag

        return run


def reference(**kw: Any) -> FakeTrial:
    return FakeTrial("EAGER", step_ms=EAGER_MS, result="same", **kw)


# What each kind of candidate is and what the ladder must make of it: status, reason start.
KINDS: dict[str, tuple[dict[str, Any], str, str]] = {
    "fast": ({"step_ms": FAST_MS}, "verified", "verified"),
    "mid": ({"step_ms": MID_MS}, "verified", "verified"),
    "slow": ({"step_ms": SLOW_MS}, "rejected", "verified, but not"),
    "wrong": ({"result": "wrong"}, "rejected", "differs from eager: output[0]:"),
    "stale_buffer": ({"result": "stale_buffer"}, "rejected", "differs from eager: buffer:mean:"),
    "nan": ({"result": "nan"}, "rejected", "differs from eager: grad:w:"),
    "renamed": ({"result": "renamed"}, "rejected", "differs from eager: results named"),
    "short": ({"result": "short"}, "rejected", "differs from eager: "),
    "reshaped": ({"result": "reshaped"}, "rejected", "differs from eager: output[0]:"),
    "fail_build": ({"fail_in": "build"}, "failed", "RuntimeError: "),
    "fail_check": ({"fail_in": "check"}, "failed", "ValueError: "),
    "fail_step": ({"fail_in": "step"}, "failed", "while timed: RuntimeError: "),
    "unavailable": ({"unavailable": True}, "unavailable", ""),
    "late": ({"build_s": 0.08}, "rejected", "compiled in"),
}
BUDGET = 0.05
OPTIONS = LadderOptions(warm_steps=3, compile_budget=BUDGET, cache=False, clock=CLOCK)


def population(kinds: list[str]) -> list[FakeTrial]:
    return [FakeTrial(f"C{i}_{kind}", **KINDS[kind][0]) for i, kind in enumerate(kinds)]


def check_invariants(
    ref: FakeTrial, candidates: list[FakeTrial], kinds: list[str], chosen: str, attempts: list
) -> None:
    """What holds whatever the population: the ladder's laws."""
    # one attempt per candidate, in order, then the reference
    assert [a.rung for a in attempts] == [c.name for c in candidates] + [ref.name]
    statuses = [a.status for a in attempts]
    assert statuses.count("chosen") == 1
    assert attempts[statuses.index("chosen")].rung == chosen
    # the fastest correct candidate wins, eager when none is faster
    if "fast" in kinds:
        assert chosen.endswith("_fast")
    elif "mid" in kinds:
        assert chosen.endswith("_mid")
    else:
        assert chosen == ref.name
    assert attempts[-1].status == ("chosen" if chosen == ref.name else "verified")
    assert attempts[-1].speedup == 1.0
    # every candidate's verdict and reason, and release for all but the chosen one
    for trial, kind, attempt in zip(candidates, kinds, attempts, strict=False):
        status, reason = KINDS[kind][1:]
        if trial.name == chosen:
            assert attempt.status == "chosen"
            assert attempt.reason == "verified and fastest"
            assert attempt.speedup >= OPTIONS.min_speedup
            assert trial.calls["release"] == 0
            continue
        assert attempt.status == status, (kind, attempt)
        assert attempt.reason.startswith(reason), (kind, attempt.reason)
        if kind == "unavailable":
            assert "needs a device" in attempt.reason
        if status == "verified":
            assert attempt.reason.startswith("verified, slower than ")
        assert trial.calls["release"] == 1, (kind, trial.calls)
        if status in ("failed", "unavailable") or attempt.reason.startswith("differs"):
            # never timed (a step that fails, fails on its first, warm call)
            assert trial.calls["step"] == (1 if kind == "fail_step" else 0)
    # the reference is never released, and checked once, only when a candidate was built:
    # a ladder of rungs unavailable here (or failing to build) runs nothing of eager's
    assert ref.calls["release"] == 0
    built = [k for k in kinds if k not in ("unavailable", "fail_build")]
    assert ref.calls["check"] == (1 if built else 0)
    # every timed candidate was timed in warm_steps pairs alternated with the reference
    timed = [a for a in attempts[:-1] if a.step_ms is not None]
    reached = len(timed) + kinds.count("fail_step")  # those that got as far as timing
    assert ref.calls["step"] == (1 if reached else 0) + OPTIONS.warm_steps * len(timed)
    # every attempt that got as far as a comparison records its error and compile time
    for attempt in attempts[:-1]:
        if attempt.status in ("chosen", "verified"):
            assert attempt.compile_s is not None and attempt.step_ms is not None
            assert attempt.max_error is not None and attempt.max_error < 1e-3


@settings(max_examples=15)
@given(st.lists(st.sampled_from(sorted(KINDS)), max_size=5))
def test_climb_laws_over_random_populations(kinds):
    ref, candidates = reference(), population(kinds)
    chosen, attempts = climb(ref, candidates, OPTIONS)
    check_invariants(ref, candidates, kinds, chosen, attempts)


@pytest.mark.parametrize(
    "kinds",
    [
        [],
        ["wrong", "mid"],
        ["mid", "wrong"],
        ["stale_buffer", "nan", "renamed", "short", "reshaped"],
        ["fail_build", "fail_check", "fail_step", "fast"],
        ["unavailable", "late", "slow"],
        ["mid", "fast", "mid"],
        ["fast", "mid", "fast"],
        ["slow", "mid", "slow"],
    ],
    ids="+".join,
)
def test_climb_cases(kinds):
    ref, candidates = reference(), population(kinds)
    chosen, attempts = climb(ref, candidates, OPTIONS)
    check_invariants(ref, candidates, kinds, chosen, attempts)


def test_a_wrong_candidate_is_never_chosen_however_fast():
    ref = reference()
    wrong = FakeTrial("WRONG", result="wrong")
    chosen, attempts = climb(ref, [wrong], OPTIONS)
    assert chosen == "EAGER"
    assert attempts[0].status == "rejected"
    assert "output[0]" in attempts[0].reason
    assert attempts[0].max_error == pytest.approx(1.0)  # 2.0 * 0.5
    assert wrong.calls["step"] == 0  # never timed
    assert wrong.calls["release"] == 1


@pytest.mark.parametrize("where", ["build", "check", "step"])
def test_a_failing_candidate_is_reported_failed(where):
    ref = reference()
    failing = FakeTrial("BROKEN", fail_in=where)
    chosen, attempts = climb(ref, [failing], OPTIONS)
    assert chosen == "EAGER"
    assert attempts[0].status == "failed"
    assert "BROKEN" in attempts[0].reason
    assert "second line" not in attempts[0].reason  # the first line of a long message
    assert failing.calls["release"] == 1


def test_an_unavailable_candidate_is_reported_unavailable():
    ref = reference()
    missing = FakeTrial("CUDA_ONLY", unavailable=True)
    chosen, attempts = climb(ref, [missing, FakeTrial("FAST")], OPTIONS)
    assert chosen == "FAST"
    assert attempts[0].status == "unavailable"
    assert attempts[0].reason == "CUDA_ONLY needs a device this machine lacks"
    assert missing.calls["check"] == 0
    assert missing.calls["release"] == 1


def test_a_candidate_over_the_compile_budget_is_rejected():
    ref = reference()
    late = FakeTrial("LATE", build_s=0.08)
    chosen, attempts = climb(ref, [late], OPTIONS)
    assert chosen == "EAGER"
    assert attempts[0].status == "rejected"
    assert attempts[0].reason == "compiled in 0.1 s, over the 0.05 s budget"
    assert attempts[0].compile_s == pytest.approx(0.08)
    assert late.calls["step"] == 0
    # the same candidate within a larger budget wins
    late = FakeTrial("LATE", build_s=0.08)
    chosen, _ = climb(reference(), [late], LadderOptions(warm_steps=3, cache=False, clock=CLOCK))
    assert chosen == "LATE"


def test_eager_is_chosen_when_nothing_is_min_speedup_faster():
    options = LadderOptions(warm_steps=3, min_speedup=4.0, cache=False, clock=CLOCK)
    ref = reference()
    near = FakeTrial("NEAR", step_ms=MID_MS)  # 2.5x eager: below the 4x asked
    chosen, attempts = climb(ref, [near], options)
    assert chosen == "EAGER"
    assert attempts[0].status == "rejected"
    assert attempts[0].reason == "verified, but not 4x faster than eager"
    assert attempts[0].speedup == pytest.approx(EAGER_MS / MID_MS)
    assert attempts[-1].status == "chosen"
    assert "no candidate was verified and faster" in attempts[-1].reason
    assert near.calls["release"] == 1


def test_the_fastest_of_several_correct_candidates_is_chosen():
    ref = reference()
    mid, fast, mid2 = (
        FakeTrial("MID", step_ms=MID_MS),
        FakeTrial("FAST"),
        FakeTrial("MID2", step_ms=MID_MS),
    )
    chosen, attempts = climb(ref, [mid, fast, mid2], OPTIONS)
    assert chosen == "FAST"
    assert [a.status for a in attempts] == ["verified", "chosen", "verified", "verified"]
    assert attempts[0].reason == "verified, slower than FAST"
    assert attempts[2].reason == "verified, slower than FAST"
    assert attempts[0].speedup == attempts[2].speedup == pytest.approx(EAGER_MS / MID_MS)
    assert attempts[1].speedup == pytest.approx(EAGER_MS / FAST_MS)
    assert [a.step_ms for a in attempts] == pytest.approx([MID_MS, FAST_MS, MID_MS, EAGER_MS])
    assert [t.calls["release"] for t in (mid, fast, mid2)] == [1, 0, 1]
    # each candidate: one warm step and warm_steps timed ones; checked once
    assert [t.calls["step"] for t in (mid, fast, mid2)] == [4, 4, 4]
    assert [t.calls["check"] for t in (mid, fast, mid2)] == [1, 1, 1]


def test_a_failing_reference_propagates():
    with pytest.raises(ValueError, match="EAGER crashed"):
        climb(reference(fail_in="check"), [FakeTrial("FAST")], OPTIONS)


def test_describe_error_keeps_type_and_first_line():
    assert describe_error(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert describe_error(KeyError()) == "KeyError: "
    long = describe_error(ValueError("x" * 1000))
    assert long == "ValueError: " + "x" * 300


def test_median_time_calls_step_the_number_of_times_asked():
    clock, costs = FakeClock(), iter([3.0, 1.0, 2.0])
    calls = []

    def step() -> None:
        calls.append(clock.advance(next(costs)))

    assert median_time(step, 3, clock) == 2.0
    assert len(calls) == 3


def test_median_time_counts_the_seconds_a_step_returns_over_the_clock():
    clock, costs = FakeClock(), iter([5.0, 0.5, 0.25, 7.0])

    def step() -> float | None:
        clock.advance(10.0)  # the trial's restoring, which a real call does not pay
        cost = next(costs)
        return None if cost > 1 else cost

    # 5.0 and 7.0 (None) are timed by the clock: 10 s each
    assert median_time(step, 4, clock) == pytest.approx((0.5 + 10.0) / 2)


def test_median_time_reads_the_performance_counter_by_default():
    # The production clock: a real step of about 1 ms, nothing asserted about its speed.
    assert median_time(lambda: None, 1) >= 0.0
    assert LadderOptions().clock is time.perf_counter


@pytest.mark.parametrize("kinds", [["mid", "fast", "mid"], ["late", "slow", "fast"]], ids="+".join)
def test_the_verdicts_hold_whatever_else_runs_on_the_machine(kinds):
    """Real time passing between the clock's readings (a loaded machine) changes nothing:
    only the fake clock is read, so the attempts are the same, to the last digit."""
    runs = []
    for pause in (0.0, 0.02):
        clock = FakeClock()
        ref = FakeTrial("EAGER", step_ms=EAGER_MS, result="same", clock=clock)
        candidates = [
            FakeTrial(f"C{i}_{kind}", clock=clock, **KINDS[kind][0]) for i, kind in enumerate(kinds)
        ]
        for trial in (ref, *candidates):
            for method in ("build", "check", "step"):
                setattr(trial, method, _pausing(getattr(trial, method), pause))
        options = LadderOptions(warm_steps=3, compile_budget=BUDGET, cache=False, clock=clock)
        chosen, attempts = climb(ref, candidates, options)
        check_invariants(ref, candidates, kinds, chosen, attempts)
        runs.append((chosen, attempts))
    assert runs[0] == runs[1]


def _pausing(call: Callable[[], Any], seconds: float) -> Callable[[], Any]:
    def paused() -> Any:
        time.sleep(seconds)  # the machine is busy elsewhere: real time passes, not the clock's
        return call()

    return paused
