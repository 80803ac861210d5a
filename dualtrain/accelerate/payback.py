"""Expected payback: when a candidate rung is worth trying during a job.

A job starts on its framework's cheapest correct fast path (`dualtrain.accelerate.rungs.STARTS`:
eager torch, ``jax.jit``) and a candidate is tried only when what it can win back exceeds
what trying it costs:

    horizon * (1 - 1 / speedup) >= compile_s + trial_steps * step_s

* ``speedup`` is what the rung is expected to gain (`rungs.PRIORS`);
* ``compile_s`` is what building it is expected to cost on this machine: the median of the
  last compiles of that rung measured here (`CompileCosts`), else the prior;
* ``step_s`` is the job's observed seconds per call (wall time since the mode's first call
  over the calls made), and ``trial_steps`` the steps a trial spends (its check, the
  reference's, a warm step each and the alternated timed pairs);
* ``horizon`` is what is left of the job: ``budget - elapsed`` when the user said how long it
  runs (``accelerate(..., budget=)``), else the time it has run so far (a job that has run
  for t seconds is expected to run about t more: the ski-rental rule, which never loses more
  than the job's own length to trying).

Everything here is arithmetic on numbers handed in, so the rules are tested with fake clocks.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from dualtrain.accelerate.rungs import PRIORS
from dualtrain.atomic import atomic_target

__all__ = ["CompileCosts", "Horizon", "due_at", "trial_steps", "worth_trying"]

_KEPT = 5  # compiles remembered per rung (the median of them is the estimate)

# A rung never built here is expected to cost what a rung of the same compiler cost: a
# donating jit compiles what jit did, CUDA graphs and the compiled step are torch.compile.
_LIKE = {"JIT_DONATE": "JIT", "CUDA_GRAPHS": "TORCH_COMPILE", "COMPILED_STEP": "TORCH_COMPILE"}


def trial_steps(warm_steps: int) -> int:
    """Steps one trial spends: both checks, a warm step each, `warm_steps` alternated pairs."""
    return 4 + 2 * warm_steps


@dataclass(frozen=True)
class Horizon:
    """How long the job is expected to go on, from what it has done.

    Attributes:
        elapsed_s: wall seconds since the mode's first call.
        calls: calls made in that time (>= 1).
        budget_s: the user's expected job length in seconds, or None (the ski-rental rule).
    """

    elapsed_s: float
    calls: int
    budget_s: float | None = None

    @property
    def step_s(self) -> float:
        """Seconds per call observed so far."""
        return self.elapsed_s / max(self.calls, 1)

    @property
    def left_s(self) -> float:
        """Seconds the job is expected to run on."""
        if self.budget_s is None:
            return self.elapsed_s
        return max(self.budget_s - self.elapsed_s, 0.0)


def _gain(rung: str, over: float, expected: float | None) -> float:
    # The fraction of each later step a rung is expected to save over what serves now.
    speedup = PRIORS[rung][1] / over if expected is None else expected
    return 1.0 - 1.0 / speedup if speedup > 1.0 else 0.0


def worth_trying(
    rung: str,
    horizon: Horizon,
    compile_s: float,
    warm_steps: int,
    over: float = 1.0,
    expected: float | None = None,
) -> bool:
    """Whether `rung` can win back its trial within `horizon`.

    Args:
        rung: the candidate (its expected speed-up is ``PRIORS[rung][1]``).
        horizon: the job so far.
        compile_s: the expected seconds to build it here.
        warm_steps: `LadderOptions.warm_steps` (what a trial's timing costs).
        over: the speed-up of what runs now over the start rung (a rung must beat that).
        expected: the speed-up over what runs now expected of `rung`, when known better
            than its prior (a rival tried again after its decision was contradicted);
            None: ``PRIORS[rung][1] / over``.
    """
    gain = _gain(rung, over, expected)
    if gain <= 0.0:
        return False
    cost = compile_s + trial_steps(warm_steps) * horizon.step_s
    return horizon.left_s * gain >= cost


def due_at(
    rung: str,
    step_s: float,
    compile_s: float,
    warm_steps: int,
    over: float = 1.0,
    expected: float | None = None,
) -> float:
    """Seconds after the mode's first call at which `rung` becomes worth trying (ski rental).

    ``math.inf`` when it never does (no gain expected beyond what runs now). With a budget,
    a rung is worth trying at the first call or never (`worth_trying`), so this is for the
    budget-free rule only. `over` and `expected` as in `worth_trying`.
    """
    gain = _gain(rung, over, expected)
    if gain <= 0.0:
        return math.inf
    return (compile_s + trial_steps(warm_steps) * step_s) / gain


class CompileCosts:
    """What building each rung cost on this machine: the last few measurements, on disk.

    One JSON file per framework in the decision cache's folder (None: kept in memory only),
    written to a temporary name and renamed; a file that does not parse is ignored.
    """

    def __init__(self, folder: Path | None, framework: str) -> None:
        self.path = None if folder is None else folder / f"compile-costs-{framework}.json"
        self._seen: dict[str, list[float]] = {}

    def _read(self) -> dict[str, list[float]]:
        if self.path is None:
            return self._seen
        try:
            data = json.loads(self.path.read_text())
            return {
                str(k): [float(x) for x in v][-_KEPT:]
                for k, v in data.items()
                if isinstance(v, list)
            }
        except (OSError, ValueError, TypeError, AttributeError):
            return dict(self._seen)

    def estimate(self, rung: str) -> float:
        """Expected seconds to build `rung` here.

        The median of its builds measured here, else of the same compiler's rung (JIT for
        JIT_DONATE, TORCH_COMPILE for CUDA_GRAPHS and COMPILED_STEP), else the prior.
        """
        seen = self._read()
        for name in (rung, _LIKE.get(rung)):
            measured = seen.get(name) if name is not None else None
            if measured:
                return float(statistics.median(measured))
        return float(PRIORS[rung][0])

    def record(self, rung: str, seconds: float) -> None:
        """Adds one measured build of `rung` (a folder that cannot be written is skipped)."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        data = self._read()
        data[rung] = [*data.get(rung, []), float(seconds)][-_KEPT:]
        self._seen = data
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_target(self.path) as tmp:
                Path(tmp).write_text(json.dumps(data, sort_keys=True))
        except OSError:
            return
