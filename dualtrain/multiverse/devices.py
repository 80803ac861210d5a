"""Host devices for JAX on the CPU: the XLA flag that asks for them, set before JAX is imported."""

from __future__ import annotations

import os
import sys

DEVICE_FLAG = "--xla_force_host_platform_device_count"


def host_devices(count: int) -> None:
    """Asks JAX for `count` host devices when it is not imported yet (CPU runs)."""
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = with_devices(os.environ.get("XLA_FLAGS", ""), count)


def with_devices(flags: str, count: int) -> str:
    """`flags` (XLA_FLAGS) asking for `count` host devices, any earlier count replaced."""
    kept = [f for f in flags.split() if not f.startswith(DEVICE_FLAG)]
    # First: XLA stops reading at a token it does not parse (a common recipe's bare
    # "intra_op_parallelism_threads=1"), so a flag after one would be lost.
    return " ".join([f"{DEVICE_FLAG}={count}", *kept])
