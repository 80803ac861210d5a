"""A cached decision's steady time: recorded by the run that decided, checked by later runs.

The arithmetic (`dualtrain.accelerate.steady`) is tested on numbers; the `Decider`'s use of
it on the fake clock of the ladder's tests, where a test sets how long the job's calls take
(a quiet machine or a busy one) and the fake trials how fast each rung is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st

from dualtrain.accelerate.dispatch import Decider, Probation
from dualtrain.accelerate.report import Decision, Explanation
from dualtrain.accelerate.steady import (
    FLOOR,
    SKIP,
    WINDOW,
    Steady,
    contradiction,
    margin,
    steady_of,
)
from tests.accelerate.test_accelerate_dispatch import PARTS, World
from tests.accelerate.test_accelerate_ladder import CLOCK
from tests.accelerate.test_accelerate_payback import JAX, JAX_RULES, STEP_S, TORCH, calls, options

KEY = ("train", "s")
WATCHED = SKIP + WINDOW + 1  # calls that end a watch (the first call only starts the clock)

intervals = st.lists(st.floats(1e-6, 10.0), min_size=SKIP + 2, max_size=SKIP + WINDOW + 8)

# -- the arithmetic ---------------------------------------------------------------------


@given(intervals, st.floats(1e-3, 1e3))
def test_a_steady_time_scales_with_its_calls_and_its_spread_does_not(seen, scale):
    base, scaled = steady_of(seen), steady_of([x * scale for x in seen])
    assert scaled.ms == pytest.approx(base.ms * scale, rel=1e-9)
    assert scaled.spread == pytest.approx(base.spread, rel=1e-6, abs=1e-12)
    assert base.spread >= 0


@given(intervals, st.lists(st.floats(0.0, 1e6), min_size=SKIP, max_size=SKIP))
def test_the_first_calls_are_left_out_and_so_is_what_follows_the_window(seen, first):
    assert steady_of([*first, *seen[SKIP:]]) == steady_of(seen)
    assert steady_of([*seen, 1e6, 1e6]) == steady_of(seen) or len(seen) < SKIP + WINDOW


@pytest.mark.parametrize("seen", [[], [0.1] * (SKIP + 1), [0.1] * SKIP + [0.1, -0.1]])
def test_too_few_or_negative_intervals_are_refused_naming_them(seen):
    with pytest.raises(ValueError, match="intervals_s"):
        steady_of(seen)


@given(
    st.floats(1e-3, 1e4),
    st.floats(0.0, 2.0),
    st.floats(1e-3, 1e4),
    st.floats(0.0, 2.0),
    st.one_of(st.none(), st.floats(0.5, 4.0)),
)
def test_a_contradiction_is_exactly_a_move_beyond_the_margin_either_way(
    recorded_ms, recorded_spread, now_ms, now_spread, low
):
    recorded, now = Steady(recorded_ms, recorded_spread), Steady(now_ms, now_spread)
    allowed = margin(recorded, now, low)
    assert allowed >= max(FLOOR, recorded_spread, now_spread)
    if low is not None and low > 1:
        assert allowed >= low - 1
    ratio = now_ms / recorded_ms
    within = 1 / (1 + allowed) <= ratio <= 1 + allowed
    assert (contradiction(recorded, now, allowed) is None) == within
    # symmetric: what contradicts one way contradicts the other way round
    assert (contradiction(now, recorded, allowed) is None) == within


@given(
    st.one_of(st.none(), st.floats(0.0, 1e3)),
    st.one_of(st.none(), st.floats(0.0, 5.0)),
    st.sampled_from(["", "PYTORCH", "JIT", "EAGER"]),
)
def test_a_decision_keeps_its_steady_time_and_its_speedup_base_through_the_cache(ms, spread, over):
    decision = Decision("train", "s", "JIT", speedup_over=over, steady_ms=ms, steady_spread=spread)
    back = Decision.from_dict(json.loads(json.dumps(decision.to_dict())))
    assert back.speedup_over == over
    if ms is None or spread is None:
        assert back.steady_ms is None and back.steady_spread is None
    else:
        assert (back.steady_ms, back.steady_spread) == (ms, spread)


# -- the Decider: record, check, re-decide only beyond the margin -----------------------


def run_job(folder: Path, step_s: float, n: int, rules: Any = None, **kw: Any) -> Any:
    """One run of the job: its Decider, its world and its runner after `n` calls."""
    decider, world = Decider("torch", TORCH, options(folder, **kw)), World(rules)
    run = decider.decide(*KEY, PARTS, world.trials(*KEY))
    calls(run, n, step_s)
    return decider, world, run


def cached(folder: Path) -> Decision:
    (path,) = [p for p in folder.glob("*.json") if not p.name.startswith("compile-costs")]
    return Decision.from_dict(json.loads(path.read_text())["decision"])


def test_the_deciding_run_records_its_steady_time_then_calls_go_straight_through(tmp_path):
    decider, _, run = run_job(tmp_path, STEP_S, WATCHED, budget=math.inf)
    assert decider.decisions[KEY].chosen == "TORCH_COMPILE"
    assert cached(tmp_path).steady_ms == pytest.approx(STEP_S * 1e3)
    assert cached(tmp_path).steady_spread == pytest.approx(0.0, abs=1e-9)
    assert run.final and decider.known(*KEY) is run.current  # no clock read from now on
    assert "steady: 5.000 ms between calls" in str(decider.explain())


def test_a_later_run_within_the_margin_re_decides_nothing_and_writes_nothing(tmp_path):
    run_job(tmp_path, STEP_S, WATCHED, budget=math.inf)
    before = {p: p.read_bytes() for p in tmp_path.glob("*.json")}
    # 20% slower between calls: within the 25% floor
    decider, world, run = run_job(tmp_path, STEP_S * 1.2, 3 * WATCHED)
    assert run.final and not decider.decisions[KEY].events
    assert world.count("build") == 2  # eager's and the chosen rung's, nothing else
    assert world.count("check") == world.count("step") == 0
    assert {p: p.read_bytes() for p in tmp_path.glob("*.json")} == before


def test_a_run_slower_beyond_the_margin_tries_the_rivals_once_and_the_next_run_is_quiet(
    tmp_path,
):
    run_job(tmp_path, STEP_S, WATCHED, budget=math.inf)  # TORCH_COMPILE won 5x, quiet
    # 3x slower between calls is within the choice's margin: at worst it beat eager 5x
    decider, world, run = run_job(tmp_path, 3 * STEP_S, 3 * WATCHED)
    assert run.final and not decider.decisions[KEY].events and world.count("check") == 0
    # 6x slower (a busy machine) is beyond it: the rivals are timed again against what
    # serves, alternated, and lose again: the decision holds, the new time is recorded
    decider, world, run = run_job(tmp_path, 6 * STEP_S, 40 * WATCHED)
    decision = decider.decisions[KEY]
    assert decision.chosen == "TORCH_COMPILE"
    (event,) = decision.events[:1]
    assert "6.00x the 5.000 ms recorded" in event and "400% margin" in event
    assert "CHANNELS_LAST, PYTORCH wait for their payback again" in event
    assert world.count("step", "CHANNELS_LAST") > 0 and world.count("step", "PYTORCH") > 0
    assert sum("steady calls" in e for e in decision.events) == 1  # one check a run
    assert run.final
    assert cached(tmp_path).steady_ms == pytest.approx(6 * STEP_S * 1e3)
    # no churn: the next run in the same state re-decides nothing
    decider, world, run = run_job(tmp_path, 6 * STEP_S, 3 * WATCHED)
    assert run.final and not decider.decisions[KEY].events
    assert world.count("check") == 0


def test_a_decision_taken_under_load_is_re_decided_on_a_quiet_machine(tmp_path):
    # Busy: every candidate timed slower than eager (within the noise), eager chosen.
    busy = {"CHANNELS_LAST": {"step_ms": 5.5}, "TORCH_COMPILE": {"step_ms": 5.5}}
    decider, _, _ = run_job(tmp_path, 2 * STEP_S, WATCHED, busy, budget=math.inf)
    assert decider.decisions[KEY].chosen == "PYTORCH"
    # Quiet: calls take half as long; the candidates are tried again by their payback and
    # the fastest wins (CHANNELS_LAST first, 2.5x; TORCH_COMPILE's prior cannot beat it).
    decider, _, run = run_job(tmp_path, STEP_S, 2000)
    decision = decider.decisions[KEY]
    assert decision.chosen == "CHANNELS_LAST"
    assert any("0.50x the 10.000 ms recorded" in e for e in decision.events)
    assert run.final and cached(tmp_path).chosen == "CHANNELS_LAST"
    assert cached(tmp_path).steady_ms == pytest.approx(STEP_S * 1e3)


def test_a_short_run_watches_without_deciding_anything(tmp_path):
    run_job(tmp_path, STEP_S, WATCHED, budget=math.inf)
    decider, world, run = run_job(tmp_path, 10 * STEP_S, SKIP + WINDOW - 1)
    assert isinstance(run, Probation) and run.watching == "check"
    assert world.count("check") == 0 and not decider.decisions[KEY].events


def test_a_decision_without_rivals_is_never_watched(tmp_path):
    # eager alone: nothing could be re-decided, so no clock is read per call
    decider, world = Decider("torch", ("PYTORCH",), options(tmp_path, budget=math.inf)), World()
    run = decider.decide(*KEY, PARTS, world.trials(*KEY))
    assert not isinstance(run, Probation)


def test_a_re_decision_keeps_the_decisions_speedups_in_one_unit(tmp_path):
    """Under JAX a whole-ladder climb times rungs over op by op; a re-decision's over JIT."""

    def job(step_s: float, n: int, **kw: Any) -> Decider:
        decider, world = Decider("jax", JAX, options(tmp_path, **kw)), World(JAX_RULES)
        calls(decider.decide(*KEY, PARTS, world.trials(*KEY)), n, step_s)
        return decider

    first = job(STEP_S, WATCHED, budget=math.inf).decisions[KEY]
    assert first.chosen == "JIT_DONATE" and first.speedup_over == "EAGER"
    speedups = {a.rung: a.speedup for a in first.attempts}
    assert speedups == pytest.approx({"JIT_DONATE": 12.5, "JIT": 10.0, "EAGER": 1.0})
    # 20x slower between calls: JIT_DONATE beat JIT by 1.25x at worst, so beyond its margin;
    # JIT is timed again against it, alternated, and loses again, at the same 10x eager
    again = job(20 * STEP_S, 40 * WATCHED).decisions[KEY]
    assert again.chosen == "JIT_DONATE"
    assert any("JIT waits for its payback again" in e for e in again.events)
    speedups = {a.rung: a.speedup for a in again.attempts}
    assert speedups["JIT"] == pytest.approx(10.0) and speedups["JIT_DONATE"] == pytest.approx(12.5)
    jit = next(a for a in again.attempts if a.rung == "JIT")
    assert jit.reason == "verified, but not 1.03x faster than JIT_DONATE"
    assert "10.00x eager" in str(Explanation(JAX, [again]))


# -- what the review of this rule found (each failed before its fix) ---------------------


def test_a_start_rejected_for_its_results_is_never_a_rival(tmp_path):
    """JAX's JIT that differs from op by op: EAGER serves, and nothing is watched or tried
    again, however much slower a later run's calls are."""
    wrong = {**JAX_RULES, "JIT": {"step_ms": 5.0, "result": "wrong"}}
    wrong["JIT_DONATE"] = {"step_ms": 4.0, "result": "wrong"}

    def job(step_s: float, n: int, **kw: Any) -> tuple[Decider, World, Any]:
        decider, world = Decider("jax", JAX, options(tmp_path, **kw)), World(wrong)
        run = decider.decide(*KEY, PARTS, world.trials(*KEY))
        calls(run, n, step_s)
        return decider, world, run

    decider, _, run = job(STEP_S, WATCHED, budget=math.inf)
    assert decider.decisions[KEY].chosen == "EAGER"
    assert not isinstance(run, Probation)  # no rival: nothing to watch
    decider, world, run = job(10 * STEP_S, 3 * WATCHED)
    assert not isinstance(run, Probation) and world.count("build", "JIT") == 0


def test_a_switch_forgets_the_old_runners_steady_time(tmp_path):
    """A run that re-decides and ends before recording leaves no steady time paired with
    the new rung: the next run records instead of checking against the old runner's."""
    busy = {"CHANNELS_LAST": {"step_ms": 5.5}, "TORCH_COMPILE": {"step_ms": 5.5}}
    run_job(tmp_path, 2 * STEP_S, WATCHED, busy, budget=math.inf)  # eager, 10 ms recorded
    decider, world = Decider("torch", TORCH, options(tmp_path)), World()
    run = decider.decide(*KEY, PARTS, world.trials(*KEY))
    for _ in range(5000):  # quiet: the contradiction, then CHANNELS_LAST's climb
        run()
        CLOCK.advance(STEP_S)
        if decider.decisions[KEY].chosen != "PYTORCH":
            break
    assert decider.decisions[KEY].chosen == "CHANNELS_LAST"
    assert cached(tmp_path).chosen == "CHANNELS_LAST" and cached(tmp_path).steady_ms is None
    _, _, run = run_job(tmp_path, STEP_S, 3)
    assert isinstance(run, Probation) and run.watching == "record"


def test_a_waiting_start_is_weighed_over_what_serves_in_the_next_run(tmp_path):
    """JIT waiting as a rival of JIT_DONATE (1.25x over it) is expected to gain 1/1.25 over
    what serves, not jit's 3x over op by op: the next run never builds it."""

    def job(step_s: float, n: int, **kw: Any) -> tuple[Decider, World]:
        decider, world = Decider("jax", JAX, options(tmp_path, **kw)), World(JAX_RULES)
        calls(decider.decide(*KEY, PARTS, world.trials(*KEY)), n, step_s)
        return decider, world

    job(STEP_S, WATCHED, budget=math.inf)  # JIT_DONATE chosen, JIT 1.25x behind it
    decider, _ = job(20 * STEP_S, WATCHED)  # contradicted: JIT waits, the job ends
    assert [a.rung for a in decider.decisions[KEY].attempts if a.status == "pending"] == ["JIT"]
    decider, world = job(STEP_S, 20000)
    assert world.count("build", "JIT") == 0
    jit = next(a for a in decider.decisions[KEY].attempts if a.rung == "JIT")
    assert jit.status == "rejected" and "cannot beat JIT_DONATE" in jit.reason


def test_a_clock_read_out_of_order_during_the_watch_never_fails_a_call(tmp_path):
    """Calls from several threads read the clock in turn; an interval that comes out
    negative (another thread's reading, a clock stepped back) counts as 0, never raises."""
    run_job(tmp_path, STEP_S, WATCHED, budget=math.inf)
    decider, world = Decider("torch", TORCH, options(tmp_path)), World()
    run = decider.decide(*KEY, PARTS, world.trials(*KEY))
    assert run.watching == "check"
    for i in range(WATCHED):
        run()
        CLOCK.advance(-3 * STEP_S if i == 5 else STEP_S)
    assert run.final and decider.known(*KEY) is run.current


def test_a_start_put_back_on_probation_stays_a_rival_in_the_runs_after(tmp_path):
    """Payback flow: a contradiction puts the start back on probation and the job ends; the
    next run rejects it by its hope (nothing over what serves), records its own steady time,
    and the run after is watched again (the start was dropped from the rivals for good)."""
    decider, _, _ = run_job(tmp_path, STEP_S, 2000)  # CHANNELS_LAST won, by payback
    assert decider.decisions[KEY].chosen == "CHANNELS_LAST"
    assert cached(tmp_path).steady_ms == pytest.approx(STEP_S * 1e3)
    decider, _, _ = run_job(tmp_path, 20 * STEP_S, WATCHED)  # busy: contradicted, then ends
    waiting = [a.rung for a in decider.decisions[KEY].attempts if a.status == "pending"]
    assert "PYTORCH" in waiting
    decider, world, run = run_job(tmp_path, STEP_S, 3 * WATCHED)  # quiet again
    assert world.count("build", "PYTORCH") == 1  # eager's own runner, never a trial
    assert cached(tmp_path).steady_ms == pytest.approx(STEP_S * 1e3)  # recorded anew
    _, _, run = run_job(tmp_path, 20 * STEP_S, 2)
    assert isinstance(run, Probation) and run.watching == "check"
