"""The neutral half of model batching: checks, member seeds, strategy choice, verdicts."""

# ruff: noqa: E501 (the refusal table keeps one case per line)

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, strategies as st

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
        (lambda: members.check_strategy("map", "torch"), "strategy must be one of ('auto', 'vmap', 'chunked', 'loop'); got strategy='map'"),
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


def test_measure_keeps_the_fastest_and_reports_the_ones_that_failed():
    def broken():
        raise RuntimeError("vmap: no batching rule")

    runs = {"vmap": broken, "slow": lambda: time.sleep(0.02), "fast": lambda: time.sleep(0.001)}
    timings, errors = dispatch.measure(runs, repeats=2)
    assert list(timings) == ["fast", "slow"] and timings["fast"] < timings["slow"]
    assert isinstance(errors["vmap"], RuntimeError)
    decision = dispatch.Decision("fast", None, "measured", timings, {"vmap": "RuntimeError: x"})
    text = dispatch.explain_text(decision, "torch", 4, "passed (fast)")
    assert "strategy: fast (measured)" in text and "<- chosen" in text
    assert "vmap     failed: RuntimeError: x" in text and "isolation probe: passed" in text
    assert "not chosen yet" in dispatch.explain_text(None, "jax", 2)


def test_rounds_stop_once_they_have_taken_the_budget():
    calls = {"a": 0, "b": 0}

    def run(name):
        calls[name] += 1
        time.sleep(0.02)  # alike, and long enough that load on the machine never makes one 3x

    runs = {name: (lambda n=name: run(n)) for name in calls}
    timings, _ = dispatch.measure(runs, repeats=3, budget=0.0)
    assert set(timings) == {"a", "b"} and calls == {"a": 2, "b": 2}  # untimed + one round
    dispatch.measure(runs, repeats=3, budget=60.0)
    assert calls == {"a": 6, "b": 6}


def _sleeper(seconds_by_members):
    """make_runs whose candidates sleep seconds_by_members[members][name]; records calls."""
    calls = []

    def make_runs(options, members):
        calls.append((dict(options), members))
        table = seconds_by_members[members]
        return {name: (lambda s=table[name]: time.sleep(s)) for name in options}

    return make_runs, calls


def test_many_members_are_first_timed_on_a_few_and_far_slower_ones_are_dropped():
    make_runs, calls = _sleeper({8: {"vmap": 0.03, "chunked": 0.001, "loop": 0.0}})
    decision = dispatch.decide("torch", "auto", 128, 128, ("prelim", 1), make_runs)
    # vmap and chunked lost by far on 8 members: the loop is chosen without timing all 128.
    assert [m for _, m in calls] == [8]
    assert decision.strategy == "loop" and set(decision.preliminary) == {"vmap", "chunked"}
    text = dispatch.explain_text(decision, "torch", 128)
    assert "on 8 members: over 1.5x the best there, not timed on all" in text


def test_close_candidates_are_timed_again_on_every_member():
    slow = {"vmap": 0.004, "chunked": 0.001, "loop": 0.0012}
    make_runs, calls = _sleeper({8: slow, None: {"vmap": 0.0, "chunked": 0.01, "loop": 0.01}})
    decision = dispatch.decide("torch", "auto", 32, 32, ("prelim", 2), make_runs)
    assert [m for _, m in calls] == [8, None] and set(calls[1][0]) == {"chunked", "loop"}
    assert decision.strategy in {"chunked", "loop"} and "vmap" in decision.preliminary
    # At most PRELIMINARY members there is one round, on every member.
    make_runs, calls = _sleeper({None: {"vmap": 0.0, "map": 0.001, "loop": 0.001}})
    assert dispatch.decide("jax", "auto", 8, 8, ("prelim", 3), make_runs).strategy == "vmap"
    assert [m for _, m in calls] == [None]


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
