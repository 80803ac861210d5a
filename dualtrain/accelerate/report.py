"""What a ladder tried, chose and rejected, and why: `explain()`'s answer.

Plain dataclasses that round-trip through JSON, so a decision read back from the decision
cache explains itself as well as a fresh one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dualtrain.accelerate.rungs import EAGER, FOLLOWS

__all__ = ["Attempt", "Decision", "Explanation", "over_label"]

# Attempt.status values
CHOSEN, VERIFIED, REJECTED, UNAVAILABLE, FAILED, PENDING = (
    "chosen",
    "verified",
    "rejected",
    "unavailable",
    "failed",
    "pending",
)


@dataclass
class Attempt:
    """One rung tried on one (mode, signature).

    Attributes:
        rung: the rung's name ("TORCH_COMPILE", "JIT", ...).
        status: "chosen", "verified" (correct, not fastest), "rejected" (wrong, too slow to
            compile, or not faster), "unavailable" (cannot run here), "failed" (raised) or
            "pending" (not tried yet: waiting for its expected payback).
        reason: why, in words.
        compile_s: seconds to build and run the first batch (compiling included).
        step_ms: median step time over the warm steps, milliseconds.
        speedup: the median step time of the decision's `Decision.speedup_over` rung
            over this rung's (alternated pairs).
        speedup_low: the lower quartile of the pairs' own ratios (the verdict's margin
            beyond the samples' spread).
        max_error: the largest absolute difference from eager over outputs, gradients
            and buffers.
    """

    rung: str
    status: str
    reason: str = ""
    compile_s: float | None = None
    step_ms: float | None = None
    speedup: float | None = None
    max_error: float | None = None
    speedup_low: float | None = None


def over_label(rung: str) -> str:
    """How a speed-up over `rung` is labelled: "eager" for the eager rungs, else the name."""
    return "eager" if rung in ("", *EAGER.values()) else rung


@dataclass
class Decision:
    """The ladder's answer for one mode ("train"/"eval") and one input signature.

    Attributes:
        mode, signature: what it decides.
        chosen: the rung that serves.
        attempts: one per rung tried or waiting.
        from_cache: read from the decision cache (not stored).
        decide_s: seconds spent deciding (trials, or reading the cache).
        events: fallbacks, climbs and re-decisions, in words (not stored).
        speedup_over: the rung the attempts' speed-ups are over: the start rung on
            payback ("" or an eager rung: eager).
        steady_ms, steady_spread: the steady time between calls under the chosen rung
            and its spread, as the run that decided saw them (`dualtrain.accelerate.steady`),
            or None before it has seen enough calls.
    """

    mode: str
    signature: str
    chosen: str
    attempts: list[Attempt] = field(default_factory=list)
    from_cache: bool = False
    decide_s: float = 0.0
    events: list[str] = field(default_factory=list)
    speedup_over: str = ""
    steady_ms: float | None = None
    steady_spread: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields the decision cache stores (not `from_cache`, not `events`)."""
        data = asdict(self)
        data.pop("from_cache")
        data.pop("events")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        """The decision `to_dict` gave; raises (KeyError, TypeError, ValueError) on bad data."""
        attempts = [Attempt(**a) for a in data["attempts"]]
        for a in attempts:  # a hand-edited file must fail here (ignored), not in str()
            for name in ("compile_s", "step_ms", "speedup", "max_error", "speedup_low"):
                if getattr(a, name) is not None:
                    setattr(a, name, float(getattr(a, name)))
        steady_ms: float | None = None
        steady_spread: float | None = None
        if data.get("steady_ms") is not None and data.get("steady_spread") is not None:
            steady_ms, steady_spread = float(data["steady_ms"]), float(data["steady_spread"])
        return cls(
            mode=str(data["mode"]),
            signature=str(data["signature"]),
            chosen=str(data["chosen"]),
            attempts=attempts,
            decide_s=float(data.get("decide_s", 0.0)),
            speedup_over=str(data.get("speedup_over", "")),
            steady_ms=steady_ms,
            steady_spread=steady_spread,
        )


@dataclass
class Explanation:
    """Everything one accelerated model decided; ``str()`` prints it as a table.

    Attributes:
        backends: the rungs in the order tried.
        decisions: one per (mode, signature) met so far, in the order met.
        approximations: what `patch_backprop` made approximate (one line per layer).
    """

    backends: tuple[str, ...]
    decisions: list[Decision]
    approximations: list[str] = field(default_factory=list)

    def chosen(self, mode: str) -> str | None:
        """The rung chosen for the first signature met in `mode`, or None if none yet."""
        for d in self.decisions:
            if d.mode == mode:
                return d.chosen
        return None

    def summary(self) -> str:
        """One line per decision: the mode, the rung chosen, its speed-up, how decided."""
        parts = []
        for d in self.decisions:
            chosen = next((a for a in d.attempts if a.rung == d.chosen), None)
            speedup = None if chosen is None else chosen.speedup
            over = over_label(d.speedup_over)
            speed = f" {speedup:.1f}x {over}" if speedup not in (None, 1.0) else ""
            waiting = sum(a.status == PENDING for a in d.attempts)
            ran = len(d.attempts) - waiting
            tried = f"{ran} rungs tried in {d.decide_s:.1f} s"
            if waiting:
                started = f"started in {d.decide_s:.1f} s" if ran == 1 else tried
                tried = f"{started}, {waiting} waiting for their payback"
            how = "from the decision cache" if d.from_cache else tried
            parts.append(f"{d.mode}: {d.chosen}{speed} ({how})")
        return "; ".join(parts) if parts else "nothing decided yet"

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-able data (with each decision's `from_cache` and `events`)."""
        return {
            "backends": list(self.backends),
            "decisions": [
                {**d.to_dict(), "from_cache": d.from_cache, "events": list(d.events)}
                for d in self.decisions
            ],
            "approximations": list(self.approximations),
        }

    def __str__(self) -> str:
        lines = [f"ladder: {' -> '.join(self.backends)}"]
        if not self.decisions:
            lines.append("  nothing decided yet: the first call in each mode decides")
        for d in self.decisions:
            source = "from the decision cache" if d.from_cache else f"decided in {d.decide_s:.1f} s"
            lines.append(f"{d.mode} {d.signature}: {d.chosen} ({source})")
            if d.steady_ms is not None:
                lines.append(
                    f"  steady: {d.steady_ms:.3f} ms between calls "
                    f"(spread {d.steady_spread or 0.0:.0%}); a later run re-decides only "
                    "beyond its margin"
                )
            for a in d.attempts:
                cols = [f"  {a.rung:<14}{a.status:<12}"]
                if a.compile_s is not None:
                    cols.append(f"compile {a.compile_s:6.2f} s")
                if a.step_ms is not None:
                    cols.append(f"step {a.step_ms:8.3f} ms")
                if a.speedup is not None:
                    cols.append(f"{a.speedup:5.2f}x {over_label(d.speedup_over)}")
                if a.max_error is not None:
                    cols.append(f"max |err| {a.max_error:.2g}")
                line = "  ".join(cols)
                lines.append(line + (f"  ({a.reason})" if a.reason else ""))
                if a.status == "chosen" and a.rung in FOLLOWS:
                    lines.append(f"    follows: {FOLLOWS[a.rung]}")
            lines.extend(f"  ! {e}" for e in d.events)
        if self.approximations:
            lines.append("approximate (patch_backprop):")
            lines.extend(f"  {a}" for a in self.approximations)
        else:
            lines.append("exact: no approximation")
        return "\n".join(lines)
