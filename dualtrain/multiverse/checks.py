"""Argument checks Multiverse shares: counts, numbers, Tanks and batches that split over devices."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, bad_argument


def is_tank(value: Any) -> bool:
    """Whether `value` is a `dualtrain.Tank`, without loading Fuel (no Tank exists before)."""
    fuel = sys.modules.get("dualtrain.fuel.tank")
    return fuel is not None and isinstance(value, fuel.Tank)


def check_divisible(i: int, order: Any, devices: int) -> None:
    """Refuses `data[i]` when a batch (full or last) does not split over its `devices`.

    `devices` is 1 where a batch goes whole to one device or stays on the host.
    """
    if devices <= 1:
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
