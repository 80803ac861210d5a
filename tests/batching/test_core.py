"""The neutral half of model batching: checks, member seeds, strategy choice, verdicts."""

# ruff: noqa: E501 (the refusal table keeps one case per line)

from __future__ import annotations

import collections
import inspect
import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from dualtrain.batching import dispatch, isolation, members
from dualtrain.errors import ArgumentError, IsolationError, ShapeError


@given(seed=st.integers(0, 2**64 - 1), batch=st.integers(1, 6))
def test_member_seeds_are_distinct_valid_and_stable(seed, batch):
    seeds = members.member_seeds(seed, batch)
    assert seeds == members.member_seeds(seed, batch)
    assert len(set(seeds)) == batch
    assert all(isinstance(s, int) and 0 <= s < 2**64 for s in seeds)
    assert members.member_seeds(seed, batch + 2)[:batch] == seeds  # growing keeps members


def test_member_seeds_of_neighbouring_seeds_do_not_overlap_and_lists_pass_through():
    assert not set(members.member_seeds(0, 8)) & set(members.member_seeds(1, 8))
    assert members.member_seeds(0, 2)[0] == 8668861027912758289  # pinned: users reproduce it
    assert members.member_seeds([3, 2**64 - 1], 2) == [3, 2**64 - 1]
    with pytest.raises(ArgumentError, match=r"seed\[1\] must be an int in \[0, 2\*\*64\)"):
        members.member_seeds([3, -1], 2)
    with pytest.raises(ArgumentError, match=r"seed must be an int in \[0, 2\*\*64\); got seed=1.5"):
        members.member_seeds(1.5, 2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: members.check_batch(0), "batch must be a positive int; got batch=0"),
        (lambda: members.check_batch(2.0), "batch must be a positive int; got batch=2.0"),
        (lambda: members.check_init("copy"), "init must be one of ('independent', 'identical'); got init='copy'"),
        (lambda: members.check_strategy("map", "torch"), "strategy must be one of ('auto', 'vmap', 'chunked', 'loop', 'stacked'); got strategy='map'"),
        (lambda: members.check_strategy(None, "jax"), "strategy must be one of ('auto', 'vmap', 'map', 'loop'); got strategy=None"),
        (lambda: members.check_flag("shared_input", "yes"), "shared_input must be a bool; got shared_input='yes'"),
        (lambda: members.check_memory_budget(-5), "memory_budget must be a positive int; got memory_budget=-5"),
        (lambda: members.check_member(3, 3), "index must be an int in [-3, 2]; got index=3"),
        (lambda: members.check_reduction("avg"), "reduction must be one of ('mean', 'sum', 'none'); got reduction='avg'"),
        (lambda: members.check_ks([1, True]), "ks must be a non-empty sequence of positive ints; got ks=[1, True]"),
        (lambda: members.check_ks("15"), "ks must be a non-empty sequence of positive ints; got ks='15'"),
        (lambda: dispatch.chunk_size(4, 100, 99), "memory_budget must hold at least one member, about 100 bytes here; got memory_budget=99"),
    ],
)  # fmt: skip
def test_refusals_name_the_argument_the_value_and_what_was_expected(call, message):
    with pytest.raises(ArgumentError) as info:
        call()
    assert str(info.value) == message


def test_leading_dimension_and_architecture_checks():
    members.check_leading("inputs[0]", (3, 2), 3, "[batch, B, ...]")
    with pytest.raises(ShapeError, match=r"got outputs of shape \(\)"):
        members.check_leading("outputs", (), 3, "[batch, B, ...]")
    ref = [("w", (2, 3), "float32", True), ("s", (2,), "float32", False)]
    members.compare_architectures(ref, list(reversed(ref)), "modules[1]")
    cases = {
        "lacks ['s'] and has ['t'] beyond it": [ref[0], ("t", (2,), "float32", False)],
        "w is a float64 parameter of shape (2, 3) there but a float32 parameter": [
            ("w", (2, 3), "float64", True),
            ref[1],
        ],
        "s is a float32 parameter of shape (2,) there but a float32 state": [
            ref[0],
            ("s", (2,), "float32", True),
        ],
    }
    for words, other in cases.items():
        with pytest.raises(ArgumentError, match=r"modules\[1\] must have the first member's"):
            members.compare_architectures(ref, other, "modules[1]")
        with pytest.raises(ArgumentError) as info:
            members.compare_architectures(ref, other, "modules[1]")
        assert words in str(info.value)


def test_plan_and_candidates_follow_the_budget():
    assert dispatch.plan("torch", "vmap", 8, 8) == ("vmap", None)
    assert dispatch.plan("torch", "vmap", 8, 3) == ("chunked", 3)
    assert dispatch.plan("jax", "vmap", 8, 3) == ("map", 3)
    assert dispatch.plan("jax", "map", 8, 8) == ("map", None)
    assert dispatch.plan("torch", "chunked", 20, 20) == ("chunked", 7)  # even chunks of <= 8
    assert dispatch.plan("torch", "loop", 8, 3) == ("loop", None)
    assert dispatch.candidates("torch", 4, 4) == {"vmap": None, "chunked": 2, "loop": None}
    assert dispatch.candidates("torch", 1, 1) == {"vmap": None, "loop": None}
    assert dispatch.plan("torch", "chunked", 5, 5) == ("chunked", 3)
    assert dispatch.candidates("torch", 32, 32) == {"vmap": None, "chunked": 8, "loop": None}
    assert dispatch.candidates("torch", 32, 5) == {"chunked": 5, "loop": None}
    assert dispatch.candidates("jax", 4, 4) == {"vmap": None, "map": None, "loop": None}
    assert dispatch.candidates("jax", 4, 2) == {"map": 2, "loop": None}
    assert dispatch.chunk_size(10, 100, None) == 10
    assert dispatch.chunk_size(10, 100, 350) == 3
    assert dispatch.chunk_size(2, 100, 10**6) == 2


class FakeClock:
    """Seconds that pass only when a fake candidate says its work took them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def work(self, seconds: float, calls: list[str] | None = None, name: str = ""):
        """A candidate whose every call takes `seconds` on this clock (and none of real time)."""

        def run() -> None:
            if calls is not None:
                calls.append(name)
            self.now += seconds

        return run


def _broken():
    raise RuntimeError("vmap: no batching rule")


def test_measure_keeps_the_fastest_and_reports_the_ones_that_failed():
    clock = FakeClock()
    runs = {"vmap": _broken, "slow": clock.work(0.25), "fast": clock.work(0.125)}
    timings, errors = dispatch.measure(runs, repeats=2, clock=clock)
    assert timings == {"fast": 0.125, "slow": 0.25} and list(timings) == ["fast", "slow"]
    assert list(errors) == ["vmap"] and isinstance(errors["vmap"], RuntimeError)
    decision = dispatch.Decision("fast", None, "measured", timings, {"vmap": "RuntimeError: x"})
    text = dispatch.explain_text(decision, "torch", 4, "passed (fast)")
    assert "strategy: fast (measured)" in text and "<- chosen" in text
    assert "    fast        125.000 ms per call  <- chosen\n    slow        250.000 ms" in text
    assert "vmap     failed: RuntimeError: x" in text and "isolation probe: passed" in text
    assert "not chosen yet" in dispatch.explain_text(None, "jax", 2)


def test_a_candidate_keeps_its_fastest_round():
    clock = FakeClock()
    costs = iter([9.0, 4.0, 2.0, 3.0])  # untimed first call, then three rounds

    def run():
        clock.now += next(costs)

    assert dispatch.measure({"only": run}, repeats=3, budget=math.inf, clock=clock) == (
        {"only": 2.0},
        {},
    )


def test_a_candidate_over_prune_times_the_best_is_not_run_again():
    clock = FakeClock()
    calls: list[str] = []
    times = {"a": 1.0, "b": dispatch.PRUNE, "c": dispatch.PRUNE + 0.125}
    runs = {n: clock.work(s, calls, n) for n, s in times.items()}
    timings, _ = dispatch.measure(runs, repeats=3, budget=math.inf, clock=clock)
    assert timings == times
    # c (over 1.5x) ran untimed and in round one; b (exactly 1.5x) stays for all three.
    assert collections.Counter(calls) == {"a": 4, "b": 4, "c": 2}


@pytest.mark.parametrize(
    ("budget", "rounds"), [(0.0, 1), (1.5, 1), (2.0, 2), (3.5, 2), (4.0, 3), (60.0, 3)]
)
def test_rounds_stop_once_they_have_taken_the_budget(budget, rounds):
    """Two candidates of 1 s a call: a round takes 2 s; none starts once over the budget."""
    clock = FakeClock()
    calls: list[str] = []
    runs = {n: clock.work(1.0, calls, n) for n in ("a", "b")}
    timings, _ = dispatch.measure(runs, repeats=3, budget=budget, clock=clock)
    assert timings == {"a": 1.0, "b": 1.0}
    assert collections.Counter(calls) == {"a": 1 + rounds, "b": 1 + rounds}  # untimed + rounds


def test_measure_and_decide_refuse_a_clock_that_is_not_callable():
    message = r"clock must be a callable returning seconds, like time.perf_counter; got clock=0.5"
    with pytest.raises(ArgumentError, match=message):
        dispatch.measure({"loop": lambda: None}, clock=0.5)
    with pytest.raises(ArgumentError, match=message):
        dispatch.decide("torch", "auto", 2, 2, ("clock",), lambda o, m: {}, clock=0.5)


def test_the_clock_is_the_performance_counter_by_default():
    for fn in (dispatch.measure, dispatch.decide):
        assert inspect.signature(fn).parameters["clock"].default is time.perf_counter
    # The production clock times a real call; nothing is asserted about its speed.
    timings, errors = dispatch.measure({"loop": lambda: None}, repeats=1)
    assert list(timings) == ["loop"] and timings["loop"] >= 0.0 and errors == {}


def _worker(clock, seconds_by_members, pause=0.0):
    """make_runs whose candidates take seconds_by_members[members][name] on `clock` (after
    `pause` real seconds: a busy machine); records the calls."""
    calls = []

    def make_runs(options, members):
        calls.append((dict(options), members))
        table = seconds_by_members[members]

        def run(seconds):
            time.sleep(pause)
            clock.now += seconds

        return {name: (lambda s=table[name]: run(s)) for name in options}

    return make_runs, calls


def test_many_members_are_first_timed_on_a_few_and_far_slower_ones_are_dropped():
    clock = FakeClock()
    make_runs, calls = _worker(clock, {8: {"vmap": 30.0, "chunked": 2.0, "loop": 1.0}})
    decision = dispatch.decide("torch", "auto", 128, 128, ("prelim", 1), make_runs, clock=clock)
    # vmap and chunked lost by far on 8 members: the loop is chosen without timing all 128.
    assert [m for _, m in calls] == [8]
    assert decision.strategy == "loop" and decision.timings == {}
    assert decision.preliminary == {"vmap": 30.0, "chunked": 2.0}
    text = dispatch.explain_text(decision, "torch", 128)
    assert "on 8 members: over 1.5x the best there, not timed on all" in text


def test_close_candidates_are_timed_again_on_every_member():
    clock = FakeClock()
    small = {"vmap": 4.0, "chunked": 2.0, "loop": 3.0}  # loop at exactly 1.5x the best stays
    make_runs, calls = _worker(clock, {8: small, None: {"vmap": 0.5, "chunked": 8.0, "loop": 5.0}})
    decision = dispatch.decide("torch", "auto", 32, 32, ("prelim", 2), make_runs, clock=clock)
    assert [m for _, m in calls] == [8, None] and set(calls[1][0]) == {"chunked", "loop"}
    assert decision.strategy == "loop" and decision.chunk is None
    assert decision.timings == {"loop": 5.0, "chunked": 8.0}
    assert decision.preliminary == {"vmap": 4.0}
    # Below PRELIMINARY_FROM members there is one round, on every member.
    make_runs, calls = _worker(clock, {None: {"vmap": 1.0, "map": 2.0, "loop": 2.0}})
    decision = dispatch.decide("jax", "auto", 8, 8, ("prelim", 3), make_runs, clock=clock)
    assert decision.strategy == "vmap" and decision.timings == {
        "vmap": 1.0,
        "map": 2.0,
        "loop": 2.0,
    }
    assert [m for _, m in calls] == [None] and decision.preliminary == {}


STRATEGY_NAMES = ("vmap", "chunked", "map", "loop")
costs = st.integers(1, 64).map(float)  # whole seconds: every difference of the clock is exact


@given(
    backend=st.sampled_from(["torch", "jax"]),
    batch=st.integers(1, 40),
    budget_chunk=st.integers(1, 40),
    small=st.fixed_dictionaries({"vmap": costs, "chunked": costs, "map": costs, "loop": costs}),
    full=st.fixed_dictionaries({"vmap": costs, "chunked": costs, "map": costs, "loop": costs}),
    failing=st.sets(st.sampled_from(["vmap", "chunked", "map"]), max_size=1),
)
@example(backend="torch", batch=1, budget_chunk=1, small=dict.fromkeys(STRATEGY_NAMES, 1.0),
         full=dict.fromkeys(STRATEGY_NAMES, 1.0), failing={"vmap"})  # fmt: skip
def test_decide_follows_its_rules_exactly_on_a_fake_clock(
    backend, batch, budget_chunk, small, full, failing
):
    """The winner is the fastest survivor on every member; the preliminary round (from 32
    members) drops exactly those over 1.5x its best; a lone survivor there is not timed
    again; a candidate that fails is reported, not chosen."""
    clock = FakeClock()
    calls = []

    def make_runs(options, members):
        calls.append(members)
        table = small if members is not None else full
        return {n: _broken if n in failing else clock.work(table[n]) for n in options}

    chunk = min(budget_chunk, batch)
    options = dispatch.candidates(backend, batch, chunk)
    decision = dispatch.decide(
        backend, "auto", batch, chunk, ("law", object()), make_runs, clock=clock
    )
    working = [n for n in options if n not in failing]
    failed = set(failing) & set(options)
    preliminary = batch >= dispatch.PRELIMINARY_FROM and len(options) > 1
    if preliminary:
        best = min(small[n] for n in working)
        dropped = {n: small[n] for n in working if small[n] > dispatch.PRUNE * best}
        survivors = [n for n in working if n not in dropped]
    else:
        dropped, survivors = {}, working
    assert decision.preliminary == dropped and set(decision.errors) == failed
    assert decision.reason == "measured" and decision.chunk == options[decision.strategy]
    if preliminary and len(survivors) == 1 and (dropped or failed):
        assert decision.strategy == survivors[0] and decision.timings == {}
        assert calls == [dispatch.PRELIMINARY]
    else:
        order = sorted(survivors, key=full.get)
        assert decision.timings == {n: full[n] for n in order} and list(decision.timings) == order
        assert decision.strategy == order[0]
        assert calls == ([dispatch.PRELIMINARY] if preliminary else []) + [None]


@pytest.mark.parametrize("batch", [4, 32])
def test_the_choice_holds_whatever_else_runs_on_the_machine(batch):
    """Real time passing between the clock's readings (a loaded machine) changes nothing:
    only the fake clock is read, so the decisions are the same, to the last digit."""
    tables = {8: {"vmap": 4.0, "chunked": 2.0, "loop": 3.0}}
    tables[None] = {"vmap": 1.5, "chunked": 1.25, "loop": 1.0}
    decisions = []
    for pause in (0.0, 0.005):
        clock = FakeClock()
        make_runs, _ = _worker(clock, tables, pause)
        key = ("busy", batch, pause)
        decisions.append(
            dispatch.decide("torch", "auto", batch, batch, key, make_runs, clock=clock)
        )
    assert decisions[0] == decisions[1] and decisions[0].strategy == "loop"


def test_the_cache_is_keyed_and_clearable():
    cache = dispatch.DecisionCache()
    cache.put(("a",), dispatch.Decision("loop"))
    assert cache.get(("a",)).strategy == "loop" and cache.get(("b",)) is None
    assert len(cache) == 1
    cache.clear()
    assert len(cache) == 0


def test_leaks_sees_other_members_move_beyond_rounding_only():
    base = {"outputs[0]": np.array([[1.0, 2.0], [3.0, 4.0]]), "state": np.zeros((2, 1))}
    same = {
        "outputs[0]": base["outputs[0]"] + [[5.0, 5.0], [0.0, 1e-14]],
        "state": np.zeros((2, 1)),
    }
    assert isolation.leaks(base, same, member=0) == []
    moved = {"outputs[0]": base["outputs[0]"] + [[0.0, 0.0], [0.0, 0.5]], "state": np.ones((2, 1))}
    found = isolation.leaks(base, moved, member=0)
    assert found == ["outputs[0] of member 1 (by 0.5)", "state of member 1 (by 1)"]
    f32 = {"y": np.array([[1.0], [1.0]], np.float32)}
    assert isolation.leaks(f32, {"y": np.array([[1.0], [1.000001]], np.float32)}, 0) == []
    error = isolation.isolation_error("loop", 0, found, "module 'bn' (Odd)")
    assert isinstance(error, IsolationError) and isinstance(error, RuntimeError)
    assert "strategy 'loop'" in str(error) and "module 'bn' (Odd) mixes members" in str(error)


def test_the_core_imports_no_framework():
    code = "import sys, dualtrain.batching; assert 'torch' not in sys.modules and 'jax' not in sys.modules"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_probe_that_fails_after_the_strategy_ran_every_member_is_a_coupling():
    def broken():
        raise RuntimeError("size of tensor a (4) must match the size of tensor b (2)")

    assert isolation.run_probe(lambda: "passed", "vmap", ran=True) == "passed"
    with pytest.raises(RuntimeError, match="size of tensor a") as info:
        isolation.run_probe(broken, "vmap", ran=False)  # forced: the module's own error
    assert not isinstance(info.value, IsolationError)
    with pytest.raises(IsolationError, match=r"strategy 'vmap': it ran every member, then"):
        isolation.run_probe(broken, "vmap", ran=True)


@pytest.mark.parametrize(
    ("batched", "alone", "verdict"),
    [
        (2.0, 1.0, "batched is 4.00x faster"),
        (12.0, 1.0, "separate trainings are faster here (1.50x)"),
    ],
)
def test_the_whole_step_is_timed_beside_separate_trainings(tmp_path, batched, alone, verdict):
    """After the choice, one whole step (with the optimizer) is timed batched and for one
    member alone; explain() says which wins, with both times, and the disk keeps them."""
    clock = FakeClock()
    asked = []

    def make_step_runs(strategy, chunk):
        asked.append((strategy, chunk))
        return {"batched": clock.work(batched), "separate": clock.work(alone)}

    make_runs, _ = _worker(clock, {None: {"vmap": 1.0, "chunked": 3.0, "loop": 2.0}})
    key = ("whole-step", batched)
    decision = dispatch.decide(
        "torch", "auto", 8, 8, key, make_runs, make_step_runs=make_step_runs, clock=clock
    )
    assert asked == [("vmap", None)]
    assert decision.step == batched and decision.separate == 8 * alone
    text = dispatch.explain_text(decision, "torch", 8)
    assert f"{batched * 1e3:.3f} ms batched; 8 separate trainings {8 * alone * 1e3:.3f} ms" in text
    assert verdict in text
    cache = dispatch.DecisionCache(tmp_path)
    cache.put(key, decision)
    assert dispatch.DecisionCache(tmp_path).get(key) == decision
    # Forced or cached decisions are not timed again; inference has no step to time.
    forced = dispatch.decide("torch", "loop", 8, 8, key, make_runs, make_step_runs=make_step_runs)
    assert forced.step is None and len(asked) == 1
    none = dispatch.decide(
        "torch", "auto", 8, 8, ("no-step",), make_runs, make_step_runs=lambda s, c: {}, clock=clock
    )
    assert none.step is None and "whole step" not in dispatch.explain_text(none, "torch", 8)


def test_with_an_optimizer_run_the_whole_step_is_the_timed_call_plus_the_optimizer():
    """The chosen strategy's forward and backward were just timed: the batched step adds the
    optimizer's step to them instead of running the whole step again."""
    clock = FakeClock()
    ran: list[str] = []

    def make_step_runs(strategy, chunk):
        costs = {"batched": 9.0, "optimizer": 0.25, "separate": 0.5}
        return {name: clock.work(cost, ran, name) for name, cost in costs.items()}

    make_runs, _ = _worker(clock, {None: {"vmap": 1.0, "chunked": 3.0, "loop": 2.0}})
    decision = dispatch.decide(
        "torch", "auto", 8, 8, ("optimizer",), make_runs, make_step_runs=make_step_runs,
        clock=clock,
    )  # fmt: skip
    assert decision.step == 1.0 + 0.25 and decision.separate == 8 * 0.5
    assert set(ran) == {"optimizer", "separate"}  # not "batched"
    # A lone survivor of the preliminary round was not timed whole: the batched step runs.
    make_runs, _ = _worker(clock, {8: {"vmap": 30.0, "chunked": 20.0, "loop": 1.0}})
    ran.clear()
    lone = dispatch.decide(
        "torch", "auto", 64, 64, ("optimizer", 2), make_runs, make_step_runs=make_step_runs,
        clock=clock,
    )  # fmt: skip
    assert lone.strategy == "loop" and lone.timings == {} and lone.step == 9.0
    assert set(ran) == {"batched", "separate"}


def test_a_decisions_notes_survive_the_disk_and_are_explained(tmp_path):
    """Why a strategy was chosen (JAX's rule) is kept with the decision, so a decision read
    back in another process still says why."""
    decision = dispatch.Decision("vmap", None, "rule", notes=("not timed: no grouped conv",))
    dispatch.DecisionCache(tmp_path).put(("notes",), decision)
    back = dispatch.DecisionCache(tmp_path).get(("notes",))
    assert back == decision and isinstance(back.notes, tuple)
    assert "    not timed: no grouped conv" in dispatch.explain_text(back, "jax", 4)


def test_a_cache_with_nowhere_to_live_keeps_decisions_in_memory(monkeypatch, tmp_path):
    """No DUALTRAIN_CACHE_DIR, no XDG_CACHE_HOME and no home directory (a container user
    without a passwd entry): decisions live in memory, nothing raises."""
    from pathlib import Path

    from dualtrain.caches import cache_folder

    monkeypatch.delenv("DUALTRAIN_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert cache_folder("batching") is None
    cache = dispatch.DecisionCache(lambda: cache_folder("batching"))
    cache.put(("k",), dispatch.Decision("vmap"))
    assert cache.get(("k",)).strategy == "vmap"
    cache.clear()


@pytest.mark.parametrize(
    "fields",
    [
        {"strategy": 3},
        {"strategy": "vmap", "chunk": "2"},
        {"strategy": "vmap", "timings": {"vmap": "fast"}},
        {"strategy": "vmap", "notes": [1]},
        {"strategy": "vmap", "step": "0.1"},
    ],
)
def test_a_decision_file_with_wrong_types_reads_as_a_miss(tmp_path, fields):
    cache = dispatch.DecisionCache(tmp_path)
    cache.put(("typed",), dispatch.Decision("vmap", None, "measured"))
    path = next(tmp_path.glob("*.json"))
    data = json.loads(path.read_text())
    data["decision"] |= fields
    path.write_text(json.dumps(data))
    assert dispatch.DecisionCache(tmp_path).get(("typed",)) is None


def test_a_decision_json_cannot_hold_is_kept_in_memory_only(tmp_path):
    cache = dispatch.DecisionCache(tmp_path)
    odd = dispatch.Decision("vmap", None, "measured", {"vmap": object()})  # type: ignore[dict-item]
    cache.put(("odd",), odd)
    assert cache.get(("odd",)) is odd and not list(tmp_path.glob("*.json"))
