"""Functional ops for ``Craft.run``, dispatched by the arrays' framework.

``dock.relu(x)`` runs torch's relu on a tensor, JAX's on a JAX array (tracers included)
and the NumPy reference on an ndarray. Each backend lists its ops in ``OPS`` in its
``layers`` module (NumPy's in `dualtrain.craft.numpy_ops`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dualtrain import backends
from dualtrain.craft import numpy_ops
from dualtrain.craft.seams import layers_part
from dualtrain.errors import ShapeError, bad_argument

__all__ = [
    "accuracy",
    "add",
    "concat",
    "cross_entropy",
    "gelu",
    "log_softmax",
    "matmul",
    "mean",
    "pad",
    "relu",
    "sigmoid",
    "softmax",
    "tanh",
]

_tables: dict[str, dict[str, Callable[..., Any]]] = {}
# An array type -> its backend's table: a type's framework never changes, and finding it
# (`backend_of`) cost 2-3 µs an op call.
_by_type: dict[type, dict[str, Callable[..., Any]]] = {}


def _op(name: str, *arrays: Any) -> Callable[..., Any]:
    kind = type(arrays[0]) if arrays else None  # none: backend_of's error below
    table = _by_type.get(kind) if kind is not None else None
    # One array (most ops) needs no generator: building one costs more than the look-up.
    if table is not None and (len(arrays) == 1 or all(type(a) is kind for a in arrays[1:])):
        return table[name]
    backend = backends.backend_of(*arrays).name
    table = _tables.get(backend)
    if table is None:
        if backend == "numpy":
            table = numpy_ops.OPS
        else:
            table = layers_part(backend).OPS
        _tables[backend] = table
    if kind is not None and all(type(a) is kind for a in arrays[1:]):
        _by_type[kind] = table
    return table[name]


def relu(x: Any) -> Any:
    """max(x, 0)."""
    return _op("relu", x)(x)


def gelu(x: Any) -> Any:
    """The exact (erf) GELU: ``x·Φ(x)``."""
    return _op("gelu", x)(x)


def sigmoid(x: Any) -> Any:
    """1 / (1 + exp(-x))."""
    return _op("sigmoid", x)(x)


def tanh(x: Any) -> Any:
    """The hyperbolic tangent."""
    return _op("tanh", x)(x)


def softmax(x: Any, axis: int = -1) -> Any:
    """exp(x) / sum(exp(x)) along `axis`."""
    return _op("softmax", x)(x, axis)


def log_softmax(x: Any, axis: int = -1) -> Any:
    """log(softmax(x)) along `axis`, computed stably."""
    return _op("log_softmax", x)(x, axis)


def concat(xs: Sequence[Any], axis: int = 0) -> Any:
    """Joins arrays along an existing axis."""
    return _op("concat", *xs)(list(xs), axis)


def add(a: Any, b: Any) -> Any:
    """Elementwise sum, with broadcasting."""
    return _op("add", a, b)(a, b)


def mean(x: Any, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Any:
    """The mean over `axis` (all axes when None)."""
    return _op("mean", x)(x, axis, keepdims)


def matmul(a: Any, b: Any) -> Any:
    """Matrix product with broadcasting over leading axes."""
    return _op("matmul", a, b)(a, b)


def pad(x: Any, pads: Sequence[Sequence[int]], value: float = 0.0) -> Any:
    """`x` padded with `value` on its last ``len(pads)`` axes.

    Args:
        x: an array of any rank >= ``len(pads)``.
        pads: ``(low, high)`` per padded axis, first axis first, as `dualtrain.autopad`
            gives them: ``pad(x, ((1, 1), (0, 2)))`` on ``(N, C, H, W)`` adds a row above and
            below and two columns on the right.
        value: the padding value.

    Raises:
        ArgumentError: pads that are not non-negative int pairs, or more of them than axes.
    """
    checked = _check_pads(pads, x)
    return _op("pad", x)(x, checked, float(value))


def cross_entropy(logits: Any, labels: Any) -> Any:
    """The mean over rows of ``-log_softmax(logits)[i, labels[i]]``: a scalar.

    Args:
        logits: ``(N, K)`` floating scores.
        labels: ``(N,)`` integer classes in ``[0, K)``. NumPy and torch raise for one
            outside (every label counts: torch's ``ignore_index`` is not used); JAX, whose
            values are not known while tracing, gives NaN.

    Raises:
        ShapeError: shapes other than ``(N, K)`` and ``(N,)``.
    """
    _check_classes("cross_entropy", logits, labels)
    return _op("cross_entropy", logits)(logits, labels)


def accuracy(logits: Any, labels: Any) -> Any:
    """The fraction of rows whose largest score is at their label.

    A scalar of logits' dtype when it is floating, else float32.

    Args:
        logits: ``(N, K)`` scores.
        labels: ``(N,)`` integer classes.

    Raises:
        ShapeError: shapes other than ``(N, K)`` and ``(N,)``.
    """
    _check_classes("accuracy", logits, labels)
    return _op("accuracy", logits)(logits, labels)


def _check_pads(pads: Any, x: Any) -> tuple[tuple[int, int], ...]:
    def is_int(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

    ok = isinstance(pads, (tuple, list)) and all(
        isinstance(p, (tuple, list)) and len(p) == 2 and all(is_int(v) and v >= 0 for v in p)
        for p in pads
    )
    if not ok or len(pads) > len(x.shape):
        raise bad_argument(
            "pads",
            pads,
            f"(low, high) pairs of ints >= 0, at most one per axis of {tuple(x.shape)}",
        )
    return tuple((int(lo), int(hi)) for lo, hi in pads)


def _check_classes(name: str, logits: Any, labels: Any) -> None:
    shape, rows = tuple(logits.shape), tuple(labels.shape)
    if len(shape) != 2 or rows != shape[:1]:
        raise ShapeError(f"{name} takes logits (N, K) and labels (N,); got {shape} and {rows}")
