"""One schema for optimizer state, so a run stopped under torch resumes under optax.

Two families cover torch's SGD/Adam/AdamW and optax's sgd/adam/adamw:

======  ===============================  ==================================  ==================
family  slots (per parameter, canonical)  torch                               optax
======  ===============================  ==================================  ==================
sgd     momentum                         SGD ``momentum_buffer``             ``TraceState.trace``
adam    exp_avg, exp_avg_sq              Adam/AdamW ``exp_avg``, ...          ``ScaleByAdamState``
======  ===============================  ==================================  ==================

`step` is the number of updates taken (Adam's bias correction needs it). Hyper-parameters
are recorded for the reader; the optimizer you resume with keeps its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["FAMILIES", "OptimizerState"]

FAMILIES = {"sgd": ("momentum",), "adam": ("exp_avg", "exp_avg_sq")}


@dataclasses.dataclass
class OptimizerState:
    """An optimizer's state in neutral form.

    Attributes:
        family: ``"sgd"`` or ``"adam"``.
        step: updates taken so far.
        slots: ``{slot: {parameter name: array (canonical layout)}}``.
        hyper: hyper-parameters as recorded by the producer (``lr``, ``betas``, ...).
    """

    family: str
    step: int
    slots: dict[str, dict[str, Any]]
    hyper: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"optimizer family must be 'sgd' or 'adam'; got {self.family!r}")
        missing = set(FAMILIES[self.family]) - set(self.slots)
        if missing:
            raise ValueError(f"{self.family} state needs slots {sorted(missing)}")

    def tensors(self) -> dict[str, Any]:
        """The slots flattened for a checkpoint: ``optimizer.<slot>.<parameter name>``."""
        return {
            f"optimizer.{slot}.{name}": value
            for slot, values in self.slots.items()
            for name, value in values.items()
        }

    @classmethod
    def from_tensors(
        cls, family: str, step: int, hyper: dict[str, Any], tensors: dict[str, Any]
    ) -> OptimizerState:
        """The inverse of `tensors`, given the manifest's family, step and hyper-parameters."""
        slots: dict[str, dict[str, Any]] = {slot: {} for slot in FAMILIES[family]}
        for key, value in tensors.items():
            _, slot, name = key.split(".", 2)
            slots[slot][name] = value
        return cls(family, step, slots, hyper)
