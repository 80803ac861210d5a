"""The cockpit under JAX: CUDA numbers as JAX devices.

The torch adapter's ``cockpit`` module has the same names (`dualtrain.cockpit.seams`).
JAX numbers a process's GPUs as CUDA does (``local_hardware_id``).
"""

from __future__ import annotations

from typing import Any

import jax

from dualtrain.errors import bad_argument

__all__ = ["devices"]


def devices(ordinals: tuple[int, ...], /) -> list[Any]:
    """JAX's device for each CUDA number; ``()`` gives ``[jax.devices("cpu")[0]]``."""
    if not ordinals:
        return [jax.devices("cpu")[0]]
    try:
        gpus = {d.local_hardware_id: d for d in jax.local_devices(backend="gpu")}
    except RuntimeError:  # no GPU backend in this jaxlib (CPU-only install)
        gpus = {}
    bad = [n for n in ordinals if n not in gpus]
    if bad:
        raise bad_argument("ordinals", tuple(ordinals), f"CUDA numbers among {sorted(gpus)} (JAX)")
    return [gpus[n] for n in ordinals]
