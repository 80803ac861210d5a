"""The NumPy table of the functional ops (``dock.relu`` and the rest on ndarrays).

It sits apart from `dualtrain.craft.reference` so `dualtrain.craft.ops` can load it without
importing the layer specs: the specs import the ops, and nothing here imports back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dualtrain.errors import OutOfRangeError

__all__ = ["OPS"]

_erf = np.frompyfunc(math.erf, 1, 1)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _pad(x: np.ndarray, pads: tuple[tuple[int, int], ...], value: float) -> np.ndarray:
    widths = ((0, 0),) * (x.ndim - len(pads)) + pads
    return np.pad(x, widths, constant_values=value)


def _classes(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    wrong = (labels < 0) | (labels >= logits.shape[-1])
    if wrong.any():
        raise OutOfRangeError(
            f"labels must be classes in [0, {logits.shape[-1]}); got {labels[wrong][:5].tolist()}"
        )
    return labels.astype(np.int64)


def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    picked = np.take_along_axis(_log_softmax(logits, -1), _classes(logits, labels)[:, None], -1)
    return -picked.mean().astype(logits.dtype)


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    dtype = logits.dtype if logits.dtype.kind == "f" else np.dtype(np.float32)
    return (logits.argmax(-1) == labels).mean().astype(dtype)


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
    "pad": _pad,
    "cross_entropy": _cross_entropy,
    "accuracy": _accuracy,
}
