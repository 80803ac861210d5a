"""Functional ops for ``Craft.run``, dispatched by the arrays' framework.

``dock.relu(x)`` runs torch's relu on a tensor, JAX's on a JAX array (tracers included)
and the NumPy reference on an ndarray. Each backend lists its ops in ``OPS`` in its
``layers`` module (NumPy's in `dualtrain.craft.numpy_ops`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dualtrain import backends
from dualtrain.craft import numpy_ops

__all__ = [
    "add",
    "concat",
    "gelu",
    "log_softmax",
    "matmul",
    "mean",
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
    if table is not None and all(type(a) is kind for a in arrays[1:]):
        return table[name]
    backend = backends.backend_of(*arrays).name
    table = _tables.get(backend)
    if table is None:
        if backend == "numpy":
            table = numpy_ops.OPS
        else:
            table = backends.load_part(backend, "layers").OPS
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
