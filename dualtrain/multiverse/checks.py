"""Argument checks Multiverse shares: counts, numbers, and batches that split over devices."""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, bad_argument


def check_divisible(i: int, to: str, order: Any, devices: int) -> None:
    """Refuses `data[i]` when a JAX batch (full or last) does not split over `devices`."""
    if devices <= 1 or to != "jax":
        return
    size = order.batch_size
    sizes = {size, order.samples_per_epoch % size or size}
    bad = sorted(s for s in sizes if s % devices)
    if bad:
        raise ArgumentError(
            f"data[{i}]: batches of {bad[0]} rows do not split over the {devices} devices this "
            "process drives; use a batch_size that is a multiple of it (and drop_last=True or "
            "the default full last batch)"
        )


def positive_count(name: str, value: Any) -> int:
    """`value` as an int >= 1, or an error naming `name`."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) or value < 1:
        raise bad_argument(name, value, "a positive int")
    return int(value)


def is_number(value: Any) -> bool:
    """Whether `value` is a real number (an int or float, NumPy's too; never a bool)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )
