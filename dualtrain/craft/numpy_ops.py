"""The NumPy table of the functional ops (``dock.relu`` and the rest on ndarrays).

It sits apart from `dualtrain.craft.reference` so `dualtrain.craft.ops` can load it without
importing the layer specs: the specs import the ops, and nothing here imports back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["OPS"]

_erf = np.frompyfunc(math.erf, 1, 1)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


OPS: dict[str, Any] = {
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: (0.5 * x * (1 + _erf(x / math.sqrt(2)).astype(np.float64))).astype(x.dtype),
    "sigmoid": lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype),
    "tanh": np.tanh,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "concat": lambda xs, axis: np.concatenate(xs, axis=axis),
    "add": np.add,
    "mean": lambda x, axis, keepdims: np.mean(x, axis=axis, keepdims=keepdims),
    "matmul": np.matmul,
}
