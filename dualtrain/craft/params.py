"""Neutral parameter names, canonical layouts and initialization, shared by every backend.

A parameter is named by its path from the root Craft, joined with dots: ``block.0.weight``.
Its canonical layout is the one `dualtrain.craft.dock` documents for the layer (torch's own
layouts, which JAX's contractions take as they are). Initial values are drawn once, in NumPy, from a
counter-based generator keyed by (seed, name), so the same seed gives the same weights in
torch and JAX, whatever the order of realization.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dualtrain import random
from dualtrain.memory import aligned_empty

__all__ = ["ParamSpec", "initial_value", "join"]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter or state tensor of a layer.

    Attributes:
        shape: the canonical shape.
        init: ``"uniform"`` (U(-bound, bound)), ``"normal"`` (N(0, std)), ``"ones"``,
            ``"zeros"``.
        scale: the bound of "uniform" or the std of "normal".
        trainable: False for state (BatchNorm statistics), which optimizers never see.
    """

    shape: tuple[int, ...]
    init: str = "uniform"
    scale: float = 1.0
    trainable: bool = True


def join(*parts: object) -> str:
    """``join("block", 0, "weight")`` -> ``"block.0.weight"`` (empty parts dropped)."""
    return ".".join(str(p) for p in parts if p != "")


def initial_value(spec: ParamSpec, name: str, seed: int, dtype: Any = np.float32) -> np.ndarray:
    """The initial value of parameter `name`: the same for a (seed, name) on every backend."""
    out = aligned_empty(spec.shape, dtype)
    if spec.init in ("ones", "zeros"):
        out.fill(1 if spec.init == "ones" else 0)
        return out
    # Philox is counter-based: a (seed, name) key names one stream, independent of the others.
    # Its 128-bit key holds the whole seed (< 2**64, checked by Craft.init) above the name's
    # 32-bit checksum; seeds below 2**32 keep the keys they always had.
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64); got seed={seed!r}")
    rng = random.stream(seed, "init", name)  # keyed by (seed, name): dualtrain.random
    if spec.init == "uniform":
        values = rng.uniform(-spec.scale, spec.scale, size=spec.shape)
    else:
        values = rng.normal(0.0, spec.scale, size=spec.shape)
    out[...] = values
    return out
