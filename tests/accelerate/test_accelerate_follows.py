"""What each rung follows of what changed since it was built: listed for every rung, and
printed by ``explain()`` under the rung chosen (#29: nothing a rung freezes goes unsaid)."""

from __future__ import annotations

import pytest

from dualtrain.accelerate.report import Attempt, Decision, Explanation
from dualtrain.accelerate.rungs import FOLLOWS, RUNGS

EVERY_RUNG = sorted({rung for table in RUNGS.values() for rung in table})
NEVER_RUN = {"RAMMER", "TORCHSCRIPT"}  # accepted for nebulgym scripts, never chosen


def test_every_rung_that_can_be_chosen_says_what_it_follows() -> None:
    assert set(FOLLOWS) == set(EVERY_RUNG) - NEVER_RUN


@pytest.mark.parametrize("rung", sorted(FOLLOWS))
def test_explain_prints_it_under_the_chosen_rung_only(rung: str) -> None:
    other = "PYTORCH" if rung != "PYTORCH" else "CHANNELS_LAST"
    decision = Decision(
        "eval", "(x: float32[2, 3])", rung,
        [Attempt(rung, "chosen"), Attempt(other, "verified")],
    )  # fmt: skip
    text = str(Explanation(("A", "B"), [decision]))
    assert f"    follows: {FOLLOWS[rung]}" in text
    assert FOLLOWS[other] not in text or FOLLOWS[other] == FOLLOWS[rung]
