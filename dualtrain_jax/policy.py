"""The JAX adapter's policy: its compile ladder and batching strategies, for the core.

`dualtrain.backends.policy("jax")` imports this module without JAX, so the core can check a
``backends=`` or ``strategy=`` argument, and plan, before a framework is loaded.
"""

from __future__ import annotations

from dualtrain.accelerate.rungs import Ladder
from dualtrain.batching.members import Strategies

__all__ = ["LADDER", "STRATEGIES"]

# The compile ladder (docs/acceleration.md). Op-by-op JAX is the reference; a job starts on
# jax.jit (verified against op-by-op JAX on the first batch only), as a user would write it.
LADDER = Ladder(
    rungs={
        "JIT_DONATE": "jax.jit with the arguments the function returns anew donated",
        "JIT": "jax.jit",
        "EAGER": "op-by-op JAX (jax.disable_jit), the reference",
    },
    eager="EAGER",
    start="JIT",
    defaults=("JIT_DONATE", "JIT", "EAGER"),
)

# Model batching's ways to run the members ("auto" measures them and keeps the fastest):
# vmap's form in chunks is lax.map, every member in one chunk without a budget.
STRATEGIES = Strategies(("vmap", "map", "loop"), "map")
