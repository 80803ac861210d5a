"""Expected payback (`dualtrain.accelerate.payback`) and the `Decider`'s probation, on fakes.

A job starts on the cheapest correct fast path and tries a candidate only when what it can
win back covers its trial. Time is the fake clock of the ladder's tests: a test moves it by
a step's cost per call, a fake trial by its own builds and steps, so every verdict here is
the same on an idle machine and a loaded one.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings, strategies as st

from dualtrain.accelerate import LadderOptions
from dualtrain.accelerate.dispatch import Decider, Probation
from dualtrain.accelerate.payback import (
    CompileCosts,
    Horizon,
    due_at,
    trial_steps,
    worth_trying,
)
from dualtrain.accelerate.rungs import PRIORS
from dualtrain.accelerate.steady import SKIP, WINDOW
from tests.accelerate.test_accelerate_dispatch import PARTS, World
from tests.accelerate.test_accelerate_ladder import CLOCK, EAGER_MS

STEP_S = EAGER_MS / 1e3  # what one call of the job costs on the fake clock
GAINING = sorted(r for r, (_, speedup) in PRIORS.items() if speedup > 1.0)
TORCH = ("CHANNELS_LAST", "TORCH_COMPILE", "CUDA_GRAPHS", "PYTORCH")


def options(folder: Path | None, **kw: Any) -> LadderOptions:
    return LadderOptions(warm_steps=2, cache=False if folder is None else folder, clock=CLOCK, **kw)


def calls(run: Any, n: int, step_s: float = STEP_S) -> list[Any]:
    """`n` calls of the job, each costing `step_s` on the fake clock; their results."""
    out = []
    for _ in range(n):
        out.append(run())
        CLOCK.advance(step_s)
    return out


def later_run(folder: Path, rules: dict[Any, dict[str, Any]] | None = None) -> tuple[Any, World]:
    """The runner a second run's first call gets from the decision cache in `folder`."""
    later, world = Decider("torch", TORCH, options(folder)), World(rules)
    return later.decide("train", "s", PARTS, world.trials("train", "s")), world


SLOW_CHANNELS: dict[Any, dict[str, Any]] = {"CHANNELS_LAST": {"step_ms": 4.5}}  # 1.11x


def slow_channels_won(folder: Path) -> tuple[Decider, World, Any, tuple[str, str]]:
    """10 s of a job in which CHANNELS_LAST won at 1.11x: TORCH_COMPILE may still gain."""
    decider, world = Decider("torch", TORCH, options(folder)), World(SLOW_CHANNELS)
    key = ("train", "s")
    run = decider.decide(*key, PARTS, world.trials(*key))
    calls(run, 2000)
    assert decider.decisions[key].chosen == "CHANNELS_LAST"
    return decider, world, run, key


# -- the rule ---------------------------------------------------------------------------


@settings(max_examples=200)
@given(
    rung=st.sampled_from(GAINING),
    step_s=st.floats(1e-5, 10.0),
    made=st.integers(1, 10**6),
    compile_s=st.floats(0.0, 600.0),
    warm=st.integers(1, 10),
)
def test_ski_rental_due_at_is_when_worth_trying_turns_true(rung, step_s, made, compile_s, warm):
    """Without a budget, a rung is worth trying exactly from `due_at` on (same step rate)."""
    elapsed = step_s * made
    due = due_at(rung, step_s, compile_s, warm)
    assume(abs(elapsed - due) > 1e-9 * max(due, 1.0))  # not on the boundary's rounding
    assert worth_trying(rung, Horizon(elapsed, made), compile_s, warm) == (elapsed >= due)
    # and what it costs at that point is no more than the job has already run
    if elapsed >= due:
        assert compile_s + trial_steps(warm) * step_s <= elapsed


@settings(max_examples=200)
@given(
    rung=st.sampled_from(GAINING),
    step_s=st.floats(1e-5, 1.0),
    made=st.lists(st.integers(1, 10**5), min_size=2, max_size=6),
    compile_s=st.floats(0.0, 100.0),
    budget=st.floats(1e-3, 1e4),
)
def test_within_a_budget_what_is_not_worth_trying_now_never_becomes_so(
    rung, step_s, made, compile_s, budget
):
    verdicts = [
        worth_trying(rung, Horizon(step_s * n, n, budget), compile_s, 2) for n in sorted(made)
    ]
    assert verdicts == sorted(verdicts, reverse=True)  # True ... then False, never back


@given(rung=st.sampled_from(sorted(PRIORS)), elapsed=st.floats(0.0, 1e9))
def test_a_rung_that_cannot_beat_what_serves_is_never_worth_trying(rung, elapsed):
    over = PRIORS[rung][1]  # what serves now is already as fast as the rung's prior
    assert not worth_trying(rung, Horizon(elapsed, 1), 0.0, 1, over=over)
    assert due_at(rung, 1e-3, 0.0, 1, over=over) == math.inf


def test_an_infinite_budget_makes_every_gaining_rung_worth_trying_at_once():
    for rung in GAINING:
        assert worth_trying(rung, Horizon(0.0, 1, math.inf), 1e6, 10)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "10", [1]])
def test_a_bad_budget_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="budget"):
        LadderOptions(budget=bad)


# -- what builds cost here --------------------------------------------------------------


def test_compile_costs_are_the_median_of_the_last_five_and_survive_a_new_process(tmp_path):
    costs = CompileCosts(tmp_path, "torch")
    assert costs.estimate("TORCH_COMPILE") == PRIORS["TORCH_COMPILE"][0]
    for seconds in (100.0, 1.0, 2.0, 3.0, 4.0, 5.0, float("nan"), -1.0):
        costs.record("TORCH_COMPILE", seconds)
    assert costs.estimate("TORCH_COMPILE") == 3.0  # 1..5: the 100 s one has aged out
    again = CompileCosts(tmp_path, "torch")  # what another run reads
    assert again.estimate("TORCH_COMPILE") == 3.0
    assert CompileCosts(tmp_path, "jax").estimate("JIT") == PRIORS["JIT"][0]  # per framework


@pytest.mark.parametrize("text", ["", "{", "[]", '{"TORCH_COMPILE": "x"}', "null"])
def test_an_unreadable_costs_file_is_ignored_and_replaced(tmp_path, text):
    costs = CompileCosts(tmp_path, "torch")
    assert costs.path is not None
    costs.path.write_text(text)
    assert costs.estimate("TORCH_COMPILE") == PRIORS["TORCH_COMPILE"][0]
    costs.record("TORCH_COMPILE", 7.0)
    assert json.loads(costs.path.read_text()) == {"TORCH_COMPILE": [7.0]}


def test_a_rung_never_built_here_is_expected_to_cost_what_its_compiler_did(tmp_path):
    costs = CompileCosts(tmp_path, "jax")
    assert costs.estimate("JIT_DONATE") == PRIORS["JIT_DONATE"][0]
    costs.record("JIT", 4.0)
    assert costs.estimate("JIT_DONATE") == 4.0  # the same jit, donating
    costs.record("JIT_DONATE", 6.0)
    assert costs.estimate("JIT_DONATE") == 6.0  # its own, once measured


def test_without_a_folder_costs_are_kept_in_memory():
    costs = CompileCosts(None, "torch")
    costs.record("ONNXRUNTIME", 0.5)
    assert costs.estimate("ONNXRUNTIME") == 0.5


# -- the probation: a job starts at once, candidates are tried when they pay back ---------


def test_a_job_starts_on_eager_and_builds_no_candidate_before_its_payback():
    decider, world = Decider("torch", TORCH, options(None)), World()
    run = decider.decide("train", "s", PARTS, world.trials("train", "s"))
    assert isinstance(run, Probation)
    assert decider.known("train", "s") is run
    assert decider.serves_eager(run)
    short = calls(run, 200)  # 1 s of a job: CHANNELS_LAST is due after ~2.6 s
    assert {name for name, _ in short} == {"PYTORCH"}
    assert world.count("build") == 1 and world.count("build", "PYTORCH") == 1
    assert world.count("check") == world.count("step") == 0  # nothing of the ladder ran
    decision = decider.decisions[("train", "s")]
    assert decision.chosen == "PYTORCH"
    pending = [a.rung for a in decision.attempts if a.status == "pending"]
    assert pending == ["CHANNELS_LAST", "TORCH_COMPILE", "CUDA_GRAPHS"]
    assert decider.explain().summary() == (
        "train: PYTORCH (started in 0.0 s, 3 waiting for their payback)"
    )


def test_each_candidate_is_tried_when_its_payback_is_due_and_the_winner_serves(tmp_path):
    decider, world = Decider("torch", TORCH, options(tmp_path)), World()
    key = ("train", "s")
    run = decider.decide("train", "s", PARTS, world.trials("train", "s"))
    channels_due = due_at("CHANNELS_LAST", STEP_S, PRIORS["CHANNELS_LAST"][0], 2)
    served = calls(run, int(channels_due / STEP_S) + 3)
    first = next(i for i, (name, _) in enumerate(served) if name != "PYTORCH")
    assert abs(first - channels_due / STEP_S) <= 2  # at its due point (fake-clock rounding)
    assert {name for name, _ in served[first:]} == {"CHANNELS_LAST"}  # tried, won (2 ms)
    assert world.count("build", "CHANNELS_LAST") == 1
    assert world.count("build", "TORCH_COMPILE") == 0  # not due yet: 30 s to build
    assert not decider.serves_eager(run)
    assert decider.decisions[key].chosen == "CHANNELS_LAST"
    # TORCH_COMPILE (1.3x) and CUDA_GRAPHS (1.5x by their priors) cannot beat CHANNELS_LAST's
    # 2.5x: they are never tried, the decision is final; its steady time is recorded over
    # the next calls, then the batch is let go and the clock unread
    watching = decider.known(*key)
    assert isinstance(watching, Probation) and watching.watching == "record"
    calls(run, SKIP + WINDOW + 1)
    runner = decider.known(*key)
    assert not isinstance(runner, Probation) and runner()[0] == "CHANNELS_LAST"
    assert decider.decisions[key].steady_ms == pytest.approx(STEP_S * 1e3)
    never = {a.rung: (a.status, a.reason) for a in decider.decisions[key].attempts}
    for rung in ("TORCH_COMPILE", "CUDA_GRAPHS"):
        assert never[rung] == ("rejected", "not tried: its prior cannot beat CHANNELS_LAST")
    cached = decider.cache.get(decider._keys[key])
    assert cached is not None and cached.chosen == "CHANNELS_LAST"
    assert cached.steady_ms == pytest.approx(STEP_S * 1e3)
    again, world2 = later_run(tmp_path)
    assert isinstance(again, Probation) and again.watching == "check"  # held against it
    assert again()[0] == "CHANNELS_LAST"
    assert world2.count("check") == 0  # trusted: nothing re-run


def test_a_partial_decision_is_cached_and_a_later_run_waits_from_it(tmp_path):
    decider, _, run, key = slow_channels_won(tmp_path)
    assert decider.known(*key) is run  # TORCH_COMPILE and CUDA_GRAPHS still wait
    cached = decider.cache.get(decider._keys[key])
    assert cached is not None and cached.chosen == "CHANNELS_LAST"
    again, world2 = later_run(tmp_path, SLOW_CHANNELS)
    assert isinstance(again, Probation) and again.current_name == "CHANNELS_LAST"
    assert again.pending == ["TORCH_COMPILE", "CUDA_GRAPHS"]
    assert again.over == pytest.approx(EAGER_MS / 4.5)  # what the waiting must beat
    assert again()[0] == "CHANNELS_LAST"
    assert world2.count("check") == 0  # trusted: nothing re-run


def test_a_final_decision_is_cached_and_calls_go_straight_to_the_runner(tmp_path):
    decider, world, run, key = slow_channels_won(tmp_path)
    # TORCH_COMPILE (1 ms) must win back its ~30 s build beyond CHANNELS_LAST's 1.11x
    over = EAGER_MS / 4.5
    due = due_at("TORCH_COMPILE", STEP_S, PRIORS["TORCH_COMPILE"][0], 2, over)
    assert 150 < due < 300
    calls(run, int(due / STEP_S) - 2100)
    assert world.count("build", "TORCH_COMPILE") == 0
    calls(run, 200)
    decision = decider.decisions[key]
    assert decision.chosen == "TORCH_COMPILE"
    runner = decider.known(*key)
    assert not isinstance(runner, Probation)  # no clock read per call from now on
    assert runner() == ("TORCH_COMPILE", key)
    statuses = {a.rung: a.status for a in decision.attempts}
    assert statuses == {
        "CHANNELS_LAST": "verified",
        "TORCH_COMPILE": "chosen",
        "CUDA_GRAPHS": "unavailable",
        "PYTORCH": "verified",
    }
    # one climb per due point, each said when and what (CUDA_GRAPHS, 1.5x by its prior, came
    # due before TORCH_COMPILE and was found unavailable at once)
    assert [e.split(" after")[0] for e in decision.events] == [
        "tried CHANNELS_LAST",
        "tried CUDA_GRAPHS",
        "tried TORCH_COMPILE",
    ]
    cached = decider.cache.get(decider._keys[key])
    assert cached is not None and cached.chosen == "TORCH_COMPILE"
    # what the builds cost here is learned: the next job's estimate is the measured one
    assert decider.costs.estimate("TORCH_COMPILE") == pytest.approx(0.0)  # fakes build at once


def test_a_second_job_reads_the_final_decision_and_starts_on_it(tmp_path):
    decider, world = Decider("torch", TORCH, options(tmp_path, budget=math.inf)), World()
    decider.decide("train", "s", PARTS, world.trials("train", "s"))
    later, world2 = Decider("torch", TORCH, options(tmp_path)), World()
    run = later.decide("train", "s", PARTS, world2.trials("train", "s"))
    assert run() == ("TORCH_COMPILE", ("train", "s"))
    assert later.decisions[("train", "s")].from_cache
    # the deciding run recorded no steady time (it made one call): this run records it
    assert isinstance(run, Probation) and run.watching == "record"
    calls(run, SKIP + WINDOW)
    assert later.known("train", "s") is not run
    assert later.cache.get(later._keys[("train", "s")]).steady_ms == pytest.approx(EAGER_MS)
    assert world2.count("check") == 0


def test_a_budget_tries_what_pays_back_within_it_at_the_second_call_and_nothing_later():
    # 20 s of job: CHANNELS_LAST (0.2 s for 1.1x) pays back, TORCH_COMPILE (30 s) cannot
    decider, world = Decider("torch", TORCH, options(None, budget=20.0)), World()
    run = decider.decide("train", "s", PARTS, world.trials("train", "s"))
    calls(run, 2)
    decision = decider.decisions[("train", "s")]
    assert decision.chosen == "CHANNELS_LAST"
    assert world.count("build", "TORCH_COMPILE") == 0
    assert run.watching == "record"  # final: its steady time is recorded, nothing tried
    never = {a.rung: a.reason for a in decision.attempts if a.status == "rejected"}
    assert "could not pay back" in never["TORCH_COMPILE"]
    # a budget too short for anything: the start serves, final, nothing built
    decider, world = Decider("torch", TORCH, options(None, budget=0.01)), World()
    run = decider.decide("train", "s", PARTS, world.trials("train", "s"))
    calls(run, 3)
    assert decider.decisions[("train", "s")].chosen == "PYTORCH"
    assert world.count("build") == 1  # PYTORCH's


def test_an_infinite_budget_climbs_the_whole_ladder_at_the_first_call():
    decider, world = Decider("torch", TORCH, options(None, budget=math.inf)), World()
    run = decider.decide("train", "s", PARTS, world.trials("train", "s"))
    assert run()[0] == "TORCH_COMPILE"
    assert world.count("build", "TORCH_COMPILE") == 1
    # final: nothing waits; only the steady time of the calls is watched, then recorded
    assert isinstance(run, Probation) and not run.pending and run.watching == "record"


JAX = ("JIT_DONATE", "JIT", "EAGER")
JAX_RULES: dict[Any, dict[str, Any]] = {
    "EAGER": {"step_ms": 50.0, "result": "same"},
    "JIT": {"step_ms": 5.0, "build_s": 1.0},  # JIT_DONATE is expected to compile as long
    "JIT_DONATE": {"step_ms": 4.0},
}


def test_jax_starts_on_jit_verified_once_against_op_by_op_never_timed_against_it():
    decider, world = Decider("jax", JAX, options(None)), World(JAX_RULES)
    run = decider.decide("call", "s", PARTS, world.trials("call", "s"))
    assert isinstance(run, Probation)
    assert run.verifying is not None and run.verifying.wait(30)
    assert run()[0] == "JIT"
    assert world.count("check", "EAGER") == 1 and world.count("check", "JIT") == 1
    assert world.count("step") == 0  # op by op is the reference, not a timed contender
    calls(run, 2)
    decision = decider.decisions[("call", "s")]
    assert decision.chosen == "JIT"
    assert "verified against eager beside the job" in decision.attempts[0].reason
    assert [a.status for a in decision.attempts if a.rung == "JIT_DONATE"] == ["pending"]
    # JIT_DONATE (4 ms against 5) is later timed against JIT, not against op by op
    calls(run, 20000)
    assert decider.decisions[("call", "s")].chosen == "JIT_DONATE"
    assert world.count("step", "EAGER") == 0
    assert world.count("check", "EAGER") == 1  # verified against JIT, the verified start
    # and its speed-up is printed over JIT, the rung it was timed against
    assert decider.explain().summary().startswith("call: JIT_DONATE 1.")
    assert "x JIT (" in decider.explain().summary()
    assert " 1.25x JIT " in str(decider.explain())


class GatedWorld(World):
    """A World whose eager check waits for `gate`: a verification still running."""

    def __init__(self, rules: dict[Any, dict[str, Any]]) -> None:
        super().__init__(rules)
        self.gate = threading.Event()

    def trials(self, mode: str, signature: str) -> Any:
        make = super().trials(mode, signature)

        def gated(names: Any) -> list[Any]:
            made = make(names)
            for trial in made:
                if trial.name == "EAGER":
                    check = trial.check

                    def waiting(check: Any = check) -> Any:
                        assert self.gate.wait(30)
                        return check()

                    trial.check = waiting
            return made

        return gated


def test_the_job_runs_on_jit_while_op_by_op_verifies_and_nothing_is_tried_before():
    world = GatedWorld(JAX_RULES)
    decider = Decider("jax", JAX, options(None))
    run = decider.decide("call", "s", PARTS, world.trials("call", "s"))
    served = calls(run, 30000)  # JIT_DONATE would be due long before this
    assert {name for name, _ in served} == {"JIT"}
    assert world.count("build", "JIT_DONATE") == 0  # not tried on an unverified start
    assert world.count("check", "EAGER") == 0
    world.gate.set()
    assert run.verifying is not None and run.verifying.wait(30)
    calls(run, 2)  # the verdict is read; JIT_DONATE is due at once (the job ran long)
    assert decider.decisions[("call", "s")].chosen == "JIT_DONATE"


def test_a_jit_start_that_differs_from_op_by_op_hands_the_job_to_eager_and_says_so(capsys):
    rules = {**JAX_RULES, "JIT": {"result": "wrong"}}
    decider, world = Decider("jax", JAX, options(None, status=False)), World(rules)
    run = decider.decide("call", "s", PARTS, world.trials("call", "s"))
    assert run()[0] == "JIT"  # what jax.jit by hand serves, until the verdict
    assert run.verifying is not None and run.verifying.wait(30)
    assert run()[0] == "EAGER"  # the next call reads the verdict
    assert decider.known("call", "s")()[0] == "EAGER"  # final, straight to eager
    decision = decider.decisions[("call", "s")]
    assert decision.chosen == "EAGER"
    statuses = {a.rung: a.status for a in decision.attempts}
    assert statuses == {"JIT": "rejected", "JIT_DONATE": "rejected", "EAGER": "chosen"}
    assert world.count("build", "JIT_DONATE") == 0
    err = capsys.readouterr().err  # said even with status=False: a switch for correctness
    assert "JIT differs from eager: output[0]" in err and "eager serves from now on" in err


def test_a_start_failing_at_run_time_falls_back_to_eager_for_good():
    decider, world = Decider("jax", JAX, options(None)), World(JAX_RULES)
    run = decider.decide("call", "s", PARTS, world.trials("call", "s"))
    assert isinstance(run, Probation)
    eager = decider.fall_back("call", "s", RuntimeError("XLA ran out of memory"))
    assert decider.known("call", "s") is eager
    assert decider.decisions[("call", "s")].chosen == "EAGER"


def test_the_learned_build_cost_moves_the_due_point(tmp_path):
    slow = {"CHANNELS_LAST": {"step_ms": 2.0, "build_s": 1.0}}
    first, world = Decider("torch", TORCH, options(tmp_path)), World(slow)
    run = first.decide("train", "s", PARTS, world.trials("train", "s"))
    calls(run, 1000)  # ~5 s: due at ~2.6 s under the prior 0.2 s
    assert world.count("build", "CHANNELS_LAST") == 1
    assert first.costs.estimate("CHANNELS_LAST") == pytest.approx(1.0)
    # the next model on this machine expects a 1 s build: due at (1 + 8 * 5 ms) / (1/11)
    second, world2 = Decider("torch", TORCH, options(tmp_path)), World(slow)
    run = second.decide("train", "t", PARTS, world2.trials("train", "t"))
    calls(run, 1000)
    assert world2.count("build", "CHANNELS_LAST") == 0
    calls(run, 1400)
    assert world2.count("build", "CHANNELS_LAST") == 1


@pytest.mark.parametrize("status", [True, False])
def test_a_long_climb_says_so_on_stderr_in_one_line_each_way(capsys, status):
    # CHANNELS_LAST expected to build in 2 s (learned): due after ~22 s of 5 ms calls
    decider, world = Decider("torch", TORCH, options(None, status=status)), World()
    decider.costs.record("CHANNELS_LAST", 2.0)
    run = decider.decide("train", "s", PARTS, world.trials("train", "s"))
    calls(run, 5000)
    assert world.count("build", "CHANNELS_LAST") == 1
    lines = capsys.readouterr().err.splitlines()
    if not status:
        assert lines == []
        return
    assert len(lines) == 2
    assert lines[0].startswith("dualtrain.accelerate: trying CHANNELS_LAST for train after ")
    assert "expected build ~2 s" in lines[0]
    assert lines[1].startswith("dualtrain.accelerate: CHANNELS_LAST serves train (tried in ")


def test_a_cheap_climb_says_nothing(capsys):
    decider, world = Decider("torch", TORCH, options(None)), World()
    run = decider.decide("train", "s", PARTS, world.trials("train", "s"))
    calls(run, 1000)  # CHANNELS_LAST (0.2 s by its prior) tried at ~2.6 s
    assert world.count("build", "CHANNELS_LAST") == 1
    assert capsys.readouterr().err == ""


def test_status_must_be_a_bool():
    with pytest.raises(ValueError, match="status"):
        LadderOptions(status="yes")


def test_a_climb_that_raises_leaves_what_serves_serving():
    # eager's rerun of the kept batch fails mid-job (an out-of-memory beside a compile)
    rules = {"PYTORCH": {"step_ms": EAGER_MS, "result": "same", "fail_in": "check"}}
    decider, world = Decider("torch", TORCH, options(None)), World(rules)
    run = decider.decide("train", "s", PARTS, world.trials("train", "s"))
    served = calls(run, 1000)  # CHANNELS_LAST due at ~528: its climb raises, caught
    assert {name for name, _ in served} == {"PYTORCH"}
    decision = decider.decisions[("train", "s")]
    status = {a.rung: (a.status, a.reason) for a in decision.attempts}
    assert status["CHANNELS_LAST"][0] == "failed"
    assert "its climb failed (ValueError" in status["CHANNELS_LAST"][1]
    assert status["TORCH_COMPILE"][0] == "pending"  # the others still wait their turn
    assert any("its climb failed" in e for e in decision.events)
    assert world.count("build", "CHANNELS_LAST") == 1  # not tried again


def test_a_new_shape_while_the_mode_waits_runs_eager_and_is_not_kept(tmp_path):
    decider, world = Decider("torch", TORCH, options(tmp_path)), World()
    first = decider.decide("train", "s1", PARTS, world.trials("train", "s1"))
    assert isinstance(first, Probation)
    second = decider.decide("train", "s2", PARTS, world.trials("train", "s2"))
    assert second()[0] == "PYTORCH"
    assert decider.cache.get(decider._keys[("train", "s2")]) is None  # decided again later
    assert decider.cache.get(decider._keys[("train", "s1")]) is not None  # waiting, kept
