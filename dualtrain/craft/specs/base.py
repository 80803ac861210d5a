"""`Layer`, the base of every dock spec, and the checks of the fields the specs share.

A spec checks its fields when built (``__post_init__``, an ArgumentError naming the field)
and its inputs when run (`Layer.check_input`, a ShapeError, DtypeError or OutOfRangeError
naming the layer, what it takes and what it got).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from dualtrain.craft import binding, checks
from dualtrain.craft.params import ParamSpec
from dualtrain.errors import bad_argument
from dualtrain.validate import check_finite, check_int

_peek = binding.peek  # read on every layer call: bound once

__all__ = ["Layer"]


@dataclasses.dataclass(frozen=True, eq=False)
class Layer:
    """Base of the dock layers: a frozen spec, hashed by identity (one object, one layer).

    Attributes:
        input_dtypes: the dtype rule of the first input, ``"params"``, ``"float"`` or
            ``"float_in_train"`` or ``"any"`` (see `dualtrain.craft.checks.check_dtype`);
            every binding applies it.
    """

    input_dtypes: ClassVar[str] = "any"
    # Whether the input checks read only shapes and dtypes (a binding may then run them once
    # per input signature); False where they read values (Embedding's ids).
    by_signature: ClassVar[bool] = True

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        bound = _peek()
        if bound is None:
            bound = binding.current(type(self).__name__)  # raises, naming the layer
        return bound.layer(self, *inputs, **kwargs)

    def params(self) -> dict[str, ParamSpec]:
        """The layer's parameters and state, by local name (``weight``, ``running_mean``)."""
        return {}

    def check_input(self, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
        """Refuses inputs this layer cannot run on, before any backend runs it.

        Every binding (torch, JAX, the NumPy reference) calls it with the layer's inputs, so
        each refuses the same inputs with the same error and message. It reads shapes and
        dtypes, which are static under JAX tracing; values (Embedding ids) only where they
        are concrete. The base accepts anything.

        Args:
            x: the first input, any array with ``shape`` and ``dtype``.
            rest: the other inputs (a Reshape's shape, given at call time).
            train: training mode (BatchNorm then needs more than one value per channel).
            kwargs: the keyword arguments of the call (``shape=`` of a Reshape).

        Raises:
            ShapeError: the input's shape does not fit the layer.
            DtypeError: the input's dtype does not fit the layer (float Embedding ids).
            OutOfRangeError: concrete Embedding ids outside ``[0, num_embeddings)``.
        """

    def check_dtype(
        self, x: Any, params_dtype: Any, *, train: bool = False, canonical: Any = None
    ) -> None:
        """Refuses an input dtype this layer does not take (`input_dtypes`), naming both.

        Every binding calls it after `check_input` with the dtype of the layer's floating
        parameters or state as they are in this run (None where it has none), and, under
        JAX, `canonical`: the map to the dtype JAX computes in (float64 -> float32 without
        x64), so the check sees what will run.

        Raises:
            DtypeError: naming the layer, the input's dtype and what it takes.
        """
        checks.check_dtype(self, x, params_dtype, train=train, canonical=canonical)


def positive(spec: Any, *names: str) -> None:
    """Each named field a positive int (NumPy ints become Python ints; bools refused)."""
    for name in names:
        object.__setattr__(spec, name, check_int(name, getattr(spec, name), minimum=1))


def flags(spec: Any, *names: str) -> None:
    """Each named field a bool (``bias=1`` or ``affine="no"`` is a mistake, not a flag)."""
    for name in names:
        value = getattr(spec, name)
        if not isinstance(value, (bool, np.bool_)):
            raise bad_argument(name, value, "True or False")
        object.__setattr__(spec, name, bool(value))


def is_int(value: object) -> bool:
    """An int or NumPy int, never a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def items(value: object) -> tuple[Any, ...]:
    """A tuple or list as a tuple; anything else as () (then refused by the caller)."""
    return tuple(value) if isinstance(value, (tuple, list)) else ()


def check_eps(spec: Any) -> None:
    """The `eps` field a positive finite float."""
    value = check_finite("eps", spec.eps, 0.0, low_open=True, expected="a positive finite float")
    object.__setattr__(spec, "eps", value)


def spatial_ndim(kernel: object, ndim: int | None) -> int:
    """The number of spatial axes: the length of a tuple `kernel`, else `ndim`, else 2."""
    if ndim is not None and (isinstance(ndim, bool) or ndim not in (1, 2, 3)):
        raise bad_argument("ndim", ndim, "1, 2 or 3")
    if isinstance(kernel, (tuple, list)):
        if ndim is not None and len(kernel) != ndim:
            raise bad_argument("kernel", kernel, f"{ndim} sizes, one per spatial axis")
        if len(kernel) not in (1, 2, 3):
            raise bad_argument("kernel", kernel, "1, 2 or 3 sizes")
        return len(kernel)
    return ndim or 2
