"""Neutral parts of model batching: member bookkeeping, strategy choice, isolation verdicts.

The framework halves are `dualtrain_torch.BatchModule` and `dualtrain_jax.BatchModule`
(docs/batching.md); each holds a `MemberBatch` (the skeleton they share) and implements its
`FrameworkHooks`. This package never imports either framework.
"""

from __future__ import annotations

from dualtrain.batching.dispatch import CACHE, Decision, DecisionCache, explain_text
from dualtrain.batching.isolation import isolation_error, leaks
from dualtrain.batching.members import INITS, STRATEGIES, member_seeds
from dualtrain.batching.skeleton import BatchSettings, Framework, FrameworkHooks, MemberBatch

__all__ = [
    "CACHE",
    "INITS",
    "STRATEGIES",
    "BatchSettings",
    "Decision",
    "DecisionCache",
    "Framework",
    "FrameworkHooks",
    "MemberBatch",
    "explain_text",
    "isolation_error",
    "leaks",
    "member_seeds",
]
