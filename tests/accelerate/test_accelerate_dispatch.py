"""`Decider`: per mode and signature, with the decision cache and sticky fallback, on fakes.

Time is the fake clock of the ladder's tests: each fake trial moves it by its own cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from dualtrain.accelerate import LadderOptions
from dualtrain.accelerate.dispatch import Decider
from tests.accelerate.test_accelerate_ladder import CLOCK, EAGER_MS, FAST_MS, MID_MS, FakeTrial

PARTS = {"model": "MLP(8, 3)", "params": [["w", [8, 3], "float32"]], "device": "cpu"}
BACKENDS = ("CHANNELS_LAST", "TORCH_COMPILE", "CUDA_GRAPHS", "PYTORCH")
DEFAULT_RULES: dict[str, dict[str, Any]] = {
    "PYTORCH": {"step_ms": EAGER_MS, "result": "same"},
    "CHANNELS_LAST": {"step_ms": MID_MS},
    "TORCH_COMPILE": {},  # the fastest
    "CUDA_GRAPHS": {"unavailable": True},
}


class World:
    """The model as an adapter sees it: how each rung behaves per mode and signature.

    Rules are looked up by (mode, signature, rung), then (mode, rung), then rung.
    """

    def __init__(self, rules: dict[Any, dict[str, Any]] | None = None) -> None:
        self.rules: dict[Any, dict[str, Any]] = {**DEFAULT_RULES, **(rules or {})}
        self.made: list[FakeTrial] = []
        self.asked: list[tuple[str, ...]] = []

    def trials(self, mode: str, signature: str) -> Callable[[Sequence[str]], list[Any]]:
        def make(names: Sequence[str]) -> list[Any]:
            self.asked.append(tuple(names))
            made = []
            for name in names:
                rule = self.rules.get(
                    (mode, signature, name), self.rules.get((mode, name), self.rules[name])
                )
                made.append(FakeTrial(name, tag=(mode, signature), **rule))
            self.made.extend(made)
            return made

        return make

    def count(self, call: str, name: str | None = None) -> int:
        return sum(t.calls[call] for t in self.made if name is None or t.name == name)


def options(folder: Path | None, **kw: Any) -> LadderOptions:
    # budget=inf: the whole ladder at the first call (the payback rules: test_accelerate_payback)
    kw.setdefault("budget", math.inf)
    return LadderOptions(warm_steps=2, cache=False if folder is None else folder, clock=CLOCK, **kw)


def decide(
    decider: Decider, world: World, mode: str, signature: str, parts: dict[str, Any] = PARTS
) -> Callable[..., Any]:
    return decider.decide(mode, signature, parts, world.trials(mode, signature))


def test_first_call_climbs_then_the_pair_is_known(tmp_path):
    decider, world = Decider("torch", BACKENDS, options(tmp_path)), World()
    assert decider.known("train", "s1") is None
    run = decide(decider, world, "train", "s1")
    assert run() == ("TORCH_COMPILE", ("train", "s1"))
    assert decider.known("train", "s1") is run
    assert decider.known("eval", "s1") is None
    assert decider.known("train", "s2") is None
    decision = decider.decisions[("train", "s1")]
    assert decision.chosen == "TORCH_COMPILE"
    assert not decision.from_cache
    # each available candidate: a warm step and two timed ones, each alternated with one of
    # eager's (after its own warm step), nothing else
    eager_steps = 1 + 2 * 2
    assert decision.decide_s == pytest.approx(
        (eager_steps * EAGER_MS + 3 * (MID_MS + FAST_MS)) / 1e3
    )
    assert [(a.rung, a.status) for a in decision.attempts] == [
        ("CHANNELS_LAST", "verified"),
        ("TORCH_COMPILE", "chosen"),
        ("CUDA_GRAPHS", "unavailable"),
        ("PYTORCH", "verified"),
    ]
    assert world.asked == [("CHANNELS_LAST", "TORCH_COMPILE", "CUDA_GRAPHS", "PYTORCH")]
    assert world.count("release", "TORCH_COMPILE") == 0
    assert world.count("release", "CHANNELS_LAST") == 1
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_a_second_decider_reads_the_decision_from_the_cache(tmp_path):
    decide(Decider("torch", BACKENDS, options(tmp_path)), World(), "train", "s1")
    later, world = Decider("torch", BACKENDS, options(tmp_path)), World()
    run = decide(later, world, "train", "s1")
    assert run() == ("TORCH_COMPILE", ("train", "s1"))
    decision = later.decisions[("train", "s1")]
    assert decision.from_cache
    assert decision.chosen == "TORCH_COMPILE"
    assert decision.decide_s == 0.0  # the fakes' builds take no time, and nothing stepped
    assert world.count("check") == 0  # no trial ran the batch
    assert world.count("step") == 0
    # only eager (the fallback) and the chosen rung were built
    assert sorted(t.name for t in world.made if t.calls["build"]) == ["PYTORCH", "TORCH_COMPILE"]
    assert later.known("train", "s1") is run
    explained = str(later.explain())
    assert "train s1: TORCH_COMPILE (from the decision cache)" in explained
    assert "verified and fastest" in explained


@pytest.mark.parametrize(
    ("parts", "kw", "backends"),
    [
        ({**PARTS, "device": "cuda:0"}, {}, BACKENDS),
        (PARTS, {"rtol": 0.5}, BACKENDS),
        (PARTS, {"min_speedup": 2.0}, BACKENDS),
        (PARTS, {}, ["TORCH_COMPILE", "CHANNELS_LAST"]),
    ],
    ids=["device", "rtol", "min_speedup", "backends"],
)
def test_the_cache_is_keyed_on_what_the_verdict_depends_on(tmp_path, parts, kw, backends):
    decide(Decider("torch", BACKENDS, options(tmp_path)), World(), "train", "s1")
    other, world = Decider("torch", backends, options(tmp_path, **kw)), World()
    decide(other, world, "train", "s1", parts)
    assert not other.decisions[("train", "s1")].from_cache
    assert world.count("check") >= 2  # climbed


def test_a_cached_rung_that_no_longer_builds_is_decided_afresh(tmp_path):
    decide(Decider("torch", BACKENDS, options(tmp_path)), World(), "train", "s1")
    later = Decider("torch", BACKENDS, options(tmp_path))
    world = World({"TORCH_COMPILE": {"fail_in": "build"}})
    run = decide(later, world, "train", "s1")
    assert run()[0] == "CHANNELS_LAST"
    decision = later.decisions[("train", "s1")]
    assert not decision.from_cache
    assert decision.chosen == "CHANNELS_LAST"
    # and the new verdict replaces the old one on disk
    again, world = Decider("torch", BACKENDS, options(tmp_path)), World()
    assert decide(again, world, "train", "s1")()[0] == "CHANNELS_LAST"
    assert again.decisions[("train", "s1")].from_cache


def test_modes_are_decided_separately(tmp_path):
    # in eval mode the compiled rung computes something else (say, it froze train mode)
    world = World({("eval", "TORCH_COMPILE"): {"result": "wrong"}})
    decider = Decider("torch", BACKENDS, options(tmp_path))
    train = decide(decider, world, "train", "s1")
    checks = world.count("check")
    evaluate = decide(decider, world, "eval", "s1")
    assert world.count("check") - checks == 3  # eval climbed: eager and the two available
    assert train() == ("TORCH_COMPILE", ("train", "s1"))
    assert evaluate() == ("CHANNELS_LAST", ("eval", "s1"))
    explanation = decider.explain()
    assert explanation.chosen("train") == "TORCH_COMPILE"
    assert explanation.chosen("eval") == "CHANNELS_LAST"
    eval_attempts = decider.decisions[("eval", "s1")].attempts
    assert eval_attempts[1].rung == "TORCH_COMPILE"
    assert eval_attempts[1].status == "rejected"
    assert "output[0]" in eval_attempts[1].reason
    # the cache keeps the two apart as well
    later, fresh = Decider("torch", BACKENDS, options(tmp_path)), World()
    assert decide(later, fresh, "eval", "s1")()[0] == "CHANNELS_LAST"
    assert decide(later, fresh, "train", "s1")()[0] == "TORCH_COMPILE"
    assert fresh.count("check") == 0


def test_a_new_signature_re_verifies_the_modes_choice():
    decider, world = Decider("torch", BACKENDS, options(None)), World()
    decide(decider, world, "train", "s1")
    steps = world.count("step")
    asked = len(world.asked)
    run = decide(decider, world, "train", "s2")
    assert run() == ("TORCH_COMPILE", ("train", "s2"))
    assert world.count("step") == steps  # no timing
    new = world.made[-2:]
    assert sorted(t.name for t in new) == ["PYTORCH", "TORCH_COMPILE"]
    assert [t.calls["check"] for t in new] == [1, 1]  # one check each
    assert world.asked[asked:] == [("PYTORCH",), ("TORCH_COMPILE",)]  # nothing else built
    decision = decider.decisions[("train", "s2")]
    assert decision.chosen == "TORCH_COMPILE"
    assert len(decision.attempts) == 1
    assert "re-verified" in decision.attempts[0].reason
    assert decision.attempts[0].max_error is not None


def test_deciding_is_timed_on_the_options_clock():
    """A re-verification's compile and the decision's time are the clock's, not the wall's."""
    world = World({("train", "s2", "TORCH_COMPILE"): {"build_s": 0.5}})
    decider = Decider("torch", BACKENDS, options(None))
    decide(decider, world, "train", "s1")
    decide(decider, world, "train", "s2")
    decision = decider.decisions[("train", "s2")]
    assert decision.attempts[0].compile_s == pytest.approx(0.5)
    assert decision.decide_s == pytest.approx(0.5)  # no step was timed
    # beyond the signature cap, nothing runs: no time passes
    capped = Decider("torch", BACKENDS, options(None, max_signatures=1))
    decide(capped, world, "train", "s1")
    decide(capped, world, "train", "s2")
    assert capped.decisions[("train", "s2")].decide_s == 0.0


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ({"result": "wrong"}, "output[0]"),
        ({"result": "stale_buffer"}, "buffer:mean"),
        ({"result": "renamed"}, "results named differently"),
        ({"fail_in": "build"}, "RuntimeError: TORCH_COMPILE cannot compile"),
        ({"fail_in": "check"}, "ValueError"),
        ({"unavailable": True}, "UnavailableError"),
    ],
    ids=["wrong", "stale_buffer", "renamed", "build", "check", "unavailable"],
)
def test_a_new_signature_where_the_choice_differs_falls_back_to_eager(rule, reason):
    world = World({("train", "s2", "TORCH_COMPILE"): rule})
    decider = Decider("torch", BACKENDS, options(None))
    decide(decider, world, "train", "s1")
    steps = world.count("step")
    run = decide(decider, world, "train", "s2")
    assert run() == ("PYTORCH", ("train", "s2"))
    assert world.count("step") == steps
    decision = decider.decisions[("train", "s2")]
    assert decision.chosen == "PYTORCH"
    assert [(a.rung, a.status) for a in decision.attempts] == [
        ("TORCH_COMPILE", "rejected"),
        ("PYTORCH", "chosen"),
    ]
    assert decision.attempts[0].reason.startswith("train's choice differs here: ")
    assert reason in decision.attempts[0].reason
    (released,) = [t for t in world.made[-2:] if t.name == "TORCH_COMPILE"]
    assert released.calls["release"] == 1
    # the first signature keeps its rung
    assert decider.known("train", "s1")() == ("TORCH_COMPILE", ("train", "s1"))


def test_beyond_max_signatures_calls_run_eager():
    decider, world = Decider("torch", BACKENDS, options(None, max_signatures=2)), World()
    decide(decider, world, "train", "s1")
    decide(decider, world, "train", "s2")
    checks = world.count("check")
    run = decide(decider, world, "train", "s3")
    assert run()[0] == "PYTORCH"
    assert world.count("check") == checks  # nothing tried
    decision = decider.decisions[("train", "s3")]
    assert decision.chosen == "PYTORCH"
    assert decision.attempts[0].reason == "more than 2 signatures in train mode: eager"
    # per mode: eval still decides its own first signatures
    assert decide(decider, world, "eval", "s3")()[0] == "TORCH_COMPILE"
    assert "more than 2 signatures" in str(decider.explain())


def test_fall_back_makes_eager_serve_the_pair_for_good(tmp_path):
    decider, world = Decider("torch", BACKENDS, options(tmp_path)), World()
    decide(decider, world, "train", "s1")
    decide(decider, world, "eval", "s1")
    error = RuntimeError("the kernel died\n(a page of compiler output)")
    eager = decider.fall_back("train", "s1", error)
    assert eager()[0] == "PYTORCH"
    assert decider.known("train", "s1") is eager
    assert decider.known("eval", "s1")()[0] == "TORCH_COMPILE"  # the other mode keeps its own
    decision = decider.decisions[("train", "s1")]
    assert decision.chosen == "PYTORCH"
    assert decision.events == [
        "TORCH_COMPILE failed at run time (RuntimeError: the kernel died); eager from now on"
    ]
    statuses = {(a.rung, a.status) for a in decision.attempts}
    assert ("TORCH_COMPILE", "failed") in statuses
    assert decision.attempts[-1].rung == "PYTORCH"
    assert decision.attempts[-1].status == "chosen"
    assert [a.status for a in decision.attempts].count("chosen") == 1
    explained = str(decider.explain())
    assert "train s1: PYTORCH" in explained
    assert "! TORCH_COMPILE failed at run time" in explained
    # written to the cache: a new Decider runs eager for it without trying anything
    later, fresh = Decider("torch", BACKENDS, options(tmp_path)), World()
    assert decide(later, fresh, "train", "s1")()[0] == "PYTORCH"
    assert later.decisions[("train", "s1")].from_cache
    assert fresh.count("check") == 0
    assert "failed at run time" in str(later.explain())
    assert decide(later, fresh, "eval", "s1")()[0] == "TORCH_COMPILE"


def test_fall_back_after_a_re_verified_signature_is_cached_too(tmp_path):
    decider, world = Decider("torch", BACKENDS, options(tmp_path)), World()
    decide(decider, world, "train", "s1")
    decide(decider, world, "train", "s2")
    decider.fall_back("train", "s2", ValueError("shape guard failed"))
    later, fresh = Decider("torch", BACKENDS, options(tmp_path)), World()
    assert decide(later, fresh, "train", "s2")()[0] == "PYTORCH"
    assert decide(later, fresh, "train", "s1")()[0] == "TORCH_COMPILE"
    assert fresh.count("check") == 0


def test_explain_mentions_choices_and_reasons():
    world = World({"CHANNELS_LAST": {"result": "wrong"}})
    decider = Decider("torch", BACKENDS, options(None), approximations=["fc1: top-k 4 of 16"])
    assert "nothing decided yet" in str(decider.explain())
    decide(decider, world, "train", "s1")
    text = str(decider.explain())
    assert (
        text.splitlines()[0] == "ladder: CHANNELS_LAST -> TORCH_COMPILE -> CUDA_GRAPHS -> PYTORCH"
    )
    assert "train s1: TORCH_COMPILE (decided in" in text
    assert "verified and fastest" in text
    assert "differs from eager: output[0]" in text
    assert "needs a device this machine lacks" in text
    assert "x eager" in text  # measured speedups
    assert "approximate (patch_backprop):" in text
    assert "fc1: top-k 4 of 16" in text
    exact = Decider("jax", ["jit"], options(None))
    assert exact.backends == ("JIT", "EAGER")
    assert "exact: no approximation" in str(exact.explain())
    assert decider.explain().to_dict()["decisions"][0]["chosen"] == "TORCH_COMPILE"


def test_a_wrong_or_failing_rung_is_never_chosen_by_a_decider():
    world = World(
        {
            "TORCH_COMPILE": {"result": "wrong"},
            "CHANNELS_LAST": {"fail_in": "step"},
        }
    )
    decider = Decider("torch", BACKENDS, options(None))
    assert decide(decider, world, "train", "s1")()[0] == "PYTORCH"
    statuses = [a.status for a in decider.decisions[("train", "s1")].attempts]
    assert statuses == ["failed", "rejected", "unavailable", "chosen"]


def test_a_mode_whose_choice_is_eager_keeps_it_for_new_signatures(tmp_path):
    # Every candidate is wrong in training: eager wins "train"; a later shape does not
    # compile and check every candidate again (inductor would recompile per shape).
    world = World({("train", "CHANNELS_LAST"): {"result": "wrong"},
                   ("train", "TORCH_COMPILE"): {"result": "wrong"}})  # fmt: skip
    decider = Decider("torch", BACKENDS, options(tmp_path))
    assert decide(decider, world, "train", "s1")()[0] == "PYTORCH"
    checks = world.count("check")
    assert decide(decider, world, "train", "s2")()[0] == "PYTORCH"
    assert world.count("check") == checks  # nothing checked, nothing compiled
    assert world.asked[-1] == ("PYTORCH",)
    decision = decider.decisions[("train", "s2")]
    assert decision.chosen == "PYTORCH" and "holds" in decision.attempts[0].reason
