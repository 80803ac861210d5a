"""Dropout: random zeroing in training, identity in evaluation."""

from __future__ import annotations

import dataclasses

from dualtrain.craft.specs.base import Layer
from dualtrain.validate import check_finite

__all__ = ["Dropout"]


@dataclasses.dataclass(frozen=True, eq=False)
class Dropout(Layer):
    """Zeroes each element with probability `p` in training, scaling the rest by 1/(1-p).

    The masks come from each framework's own generator (torch's, or the `rng` key given to
    JAX's apply): training-mode outputs differ between backends; evaluation is identity.
    """

    input_dtypes = "float_in_train"  # see dualtrain.craft.checks.check_dtype

    p: float = 0.5

    def __post_init__(self) -> None:
        p = check_finite("p", self.p, 0.0, 1.0, high_open=True, expected="a float in [0, 1)")
        object.__setattr__(self, "p", p)
