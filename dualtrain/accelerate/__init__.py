"""Acceleration: the verified compile ladder, its decision cache, approximate backprop.

nebulgym's ``accelerate_model`` done right (docs/acceleration.md). The core holds what both
frameworks share: the rung names and the ``backends=`` argument (`rungs`), the knobs
(`options`), comparing a candidate with eager (`compare`), the ladder itself (`ladder`),
when a candidate pays back its trial (`payback`), per-mode and per-signature bookkeeping
with the start rung's probation and sticky fallback (`dispatch`), the decision cache
on disk (`decisions`), `explain()`'s report (`report`) and the top-k rule of the approximate
backprop (`topk`). The adapters' ``compilation`` modules supply the rungs. This package
imports neither torch nor JAX.
"""

from __future__ import annotations

from dualtrain.accelerate.decisions import DecisionCache, default_folder
from dualtrain.accelerate.ladder import UnavailableError
from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import Attempt, Decision, Explanation
from dualtrain.accelerate.rungs import DEFAULTS, RUNGS, parse_backends

__all__ = [
    "DEFAULTS",
    "RUNGS",
    "Attempt",
    "Decision",
    "DecisionCache",
    "Explanation",
    "LadderOptions",
    "UnavailableError",
    "default_folder",
    "parse_backends",
]
