"""The neutral layer set. Each layer is a frozen spec: sizes and options, no arrays.

Data are channels-first, as in torch: Dense takes ``(..., in)``; Conv and pooling take
``(N, C, *spatial)``; BatchNorm takes ``(N, C, ...)``. The canonical parameter layouts are
torch's, so torch modules and checkpoints hold them as they are; JAX contracts them directly
(``lax.dot_general``, ``OIHW`` kernels) at no cost:

=============  ===================================  ==============================
layer          parameter: shape                     initial value
=============  ===================================  ==============================
Dense          weight ``(out, in)``, bias ``(out,)``  U(±1/sqrt(in))
Conv           weight ``(out, in/groups, *kernel)``  U(±1/sqrt(in/groups·prod(kernel)))
ConvTranspose  weight ``(in, out/groups, kh, kw)``  U(±1/sqrt(out/groups·kh·kw))
BatchNorm      weight, bias ``(C,)``; state          ones, zeros; running_mean 0,
               running_mean, running_var ``(C,)``   running_var 1
LayerNorm      weight, bias ``shape``               ones, zeros
Embedding      weight ``(num, dim)``                N(0, 1)
=============  ===================================  ==============================

Calling a layer inside ``Craft.run`` runs it on the backend of the realized module. The
same spec object used twice is one layer: its weights are tied. Sizes given as an int or a
tuple (kernel, stride, ...) are stored as tuples after construction.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from dualtrain.craft import binding, ops
from dualtrain.craft.ops import (  # the functional ops live in dock too: dock.relu(x)
    add as add,
    concat as concat,
    gelu as gelu,
    log_softmax as log_softmax,
    matmul as matmul,
    mean as mean,
    relu as relu,
    sigmoid as sigmoid,
    softmax as softmax,
    tanh as tanh,
)
from dualtrain.craft.padding import check_padding, to_tuple
from dualtrain.craft.params import ParamSpec
from dualtrain.errors import bad_argument
from dualtrain.validate import check_finite, check_int

__all__ = [
    "AvgPool",
    "BatchNorm",
    "Conv",
    "ConvTranspose",
    "Dense",
    "Dropout",
    "Embedding",
    "Flatten",
    "GlobalAvgPool",
    "GlobalMaxPool",
    "Layer",
    "LayerNorm",
    "MaxPool",
    "Native",
    "Reshape",
    "Sequential",
    *ops.__all__,
]


def _positive(spec: Any, *names: str) -> None:
    """Each named field a positive int (NumPy ints become Python ints; bools refused)."""
    for name in names:
        object.__setattr__(spec, name, check_int(name, getattr(spec, name), minimum=1))


def _flags(spec: Any, *names: str) -> None:
    """Each named field a bool (``bias=1`` or ``affine="no"`` is a mistake, not a flag)."""
    for name in names:
        value = getattr(spec, name)
        if not isinstance(value, (bool, np.bool_)):
            raise bad_argument(name, value, "True or False")
        object.__setattr__(spec, name, bool(value))


def _check_channels(spec: Any) -> None:
    """Positive channel counts and groups, and groups dividing both (Conv, ConvTranspose)."""
    _positive(spec, "in_channels", "out_channels", "groups")
    _flags(spec, "bias")
    if spec.in_channels % spec.groups or spec.out_channels % spec.groups:
        raise bad_argument(
            "groups",
            spec.groups,
            f"a divisor of in_channels={spec.in_channels} and out_channels={spec.out_channels}",
        )


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _items(value: object) -> tuple[Any, ...]:
    """A tuple or list as a tuple; anything else as () (then refused by the caller)."""
    return tuple(value) if isinstance(value, (tuple, list)) else ()


def _plain(value: Any) -> Any:
    """Checked padding with NumPy ints as Python ints and lists as tuples."""
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return int(value)


def _eps(spec: Any) -> None:
    eps = check_finite("eps", spec.eps, 0.0, low_open=True, expected="a positive finite float")
    object.__setattr__(spec, "eps", eps)


def _ndim(kernel: object, ndim: int | None) -> int:
    if ndim is not None and (isinstance(ndim, bool) or ndim not in (1, 2, 3)):
        raise bad_argument("ndim", ndim, "1, 2 or 3")
    if isinstance(kernel, (tuple, list)):
        if ndim is not None and len(kernel) != ndim:
            raise bad_argument("kernel", kernel, f"{ndim} sizes, one per spatial axis")
        if len(kernel) not in (1, 2, 3):
            raise bad_argument("kernel", kernel, "1, 2 or 3 sizes")
        return len(kernel)
    return ndim or 2


@dataclasses.dataclass(frozen=True, eq=False)
class Layer:
    """Base of the dock layers: a frozen spec, hashed by identity (one object, one layer)."""

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return binding.current(type(self).__name__).layer(self, *inputs, **kwargs)

    def params(self) -> dict[str, ParamSpec]:
        """The layer's parameters and state, by local name (``weight``, ``running_mean``)."""
        return {}


@dataclasses.dataclass(frozen=True, eq=False)
class Dense(Layer):
    """``y = x @ weight.T + bias`` over the last axis: ``(..., in) -> (..., out)``."""

    in_features: int
    out_features: int
    bias: bool = True

    def __post_init__(self) -> None:
        _positive(self, "in_features", "out_features")
        _flags(self, "bias")

    def params(self) -> dict[str, ParamSpec]:
        bound = 1 / math.sqrt(self.in_features)
        out = {"weight": ParamSpec((self.out_features, self.in_features), "uniform", bound)}
        if self.bias:
            out["bias"] = ParamSpec((self.out_features,), "uniform", bound)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class Conv(Layer):
    """Convolution over 1, 2 or 3 spatial axes: ``(N, in, *S) -> (N, out, *S')``.

    `padding` is an int, one int per axis, ``(low, high)`` pairs per axis, ``"valid"`` (none)
    or ``"same"`` (``ceil(S / stride)`` outputs, the odd element on the high side). `ndim`
    comes from a tuple `kernel`, else defaults to 2.
    """

    in_channels: int
    out_channels: int
    kernel: Any
    stride: Any = 1
    padding: Any = 0
    dilation: Any = 1
    groups: int = 1
    bias: bool = True
    ndim: Any = None

    def __post_init__(self) -> None:
        _check_channels(self)
        nd = _ndim(self.kernel, self.ndim)
        object.__setattr__(self, "ndim", int(nd))
        for name in ("kernel", "stride", "dilation"):
            object.__setattr__(self, name, to_tuple(getattr(self, name), nd, name))
        check_padding(self.padding, nd)
        object.__setattr__(self, "padding", _plain(self.padding))

    def params(self) -> dict[str, ParamSpec]:
        fan_in = self.in_channels // self.groups * math.prod(self.kernel)
        bound = 1 / math.sqrt(fan_in)
        shape = (self.out_channels, self.in_channels // self.groups, *self.kernel)
        out = {"weight": ParamSpec(shape, "uniform", bound)}
        if self.bias:
            out["bias"] = ParamSpec((self.out_channels,), "uniform", bound)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class ConvTranspose(Layer):
    """2-D transposed convolution, torch's semantics: ``(N, in, H, W) -> (N, out, H', W')``.

    ``H' = (H - 1)·stride - 2·padding + dilation·(k - 1) + output_padding + 1``.
    """

    in_channels: int
    out_channels: int
    kernel: Any
    stride: Any = 1
    padding: Any = 0
    output_padding: Any = 0
    dilation: Any = 1
    groups: int = 1
    bias: bool = True

    def __post_init__(self) -> None:
        _check_channels(self)
        for name in ("kernel", "stride", "dilation"):
            object.__setattr__(self, name, to_tuple(getattr(self, name), 2, name))
        for name in ("padding", "output_padding"):
            value = getattr(self, name)
            pair = (value, value) if _is_int(value) else _items(value)
            if len(pair) != 2 or not all(_is_int(v) and v >= 0 for v in pair):
                raise bad_argument(name, value, "a non-negative int or 2 of them")
            object.__setattr__(self, name, tuple(int(v) for v in pair))
        for op, s, d in zip(self.output_padding, self.stride, self.dilation, strict=True):
            if op >= max(s, d):
                raise bad_argument(
                    "output_padding", self.output_padding, "smaller than stride or dilation"
                )

    def params(self) -> dict[str, ParamSpec]:
        kh, kw = self.kernel
        bound = 1 / math.sqrt(self.out_channels // self.groups * kh * kw)
        out = {
            "weight": ParamSpec(
                (self.in_channels, self.out_channels // self.groups, kh, kw), "uniform", bound
            )
        }
        if self.bias:
            out["bias"] = ParamSpec((self.out_channels,), "uniform", bound)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class _Pool(Layer):
    kernel: Any
    stride: Any = None
    padding: Any = 0
    ndim: Any = None

    def __post_init__(self) -> None:
        nd = _ndim(self.kernel, self.ndim)
        object.__setattr__(self, "ndim", int(nd))
        object.__setattr__(self, "kernel", to_tuple(self.kernel, nd, "kernel"))
        stride = self.kernel if self.stride is None else self.stride
        object.__setattr__(self, "stride", to_tuple(stride, nd, "stride"))
        pads = (self.padding,) * nd if _is_int(self.padding) else _items(self.padding)
        ok = len(pads) == nd and all(_is_int(p) and p >= 0 for p in pads)
        if not ok or any(2 * p > k for p, k in zip(pads, self.kernel, strict=True)):
            raise bad_argument("padding", self.padding, "non-negative ints of at most kernel/2")
        object.__setattr__(self, "padding", tuple(int(p) for p in pads))


@dataclasses.dataclass(frozen=True, eq=False)
class MaxPool(_Pool):
    """Max over windows: ``(N, C, *S) -> (N, C, *S')``; padding counts as -inf."""


@dataclasses.dataclass(frozen=True, eq=False)
class AvgPool(_Pool):
    """Mean over windows: ``(N, C, *S) -> (N, C, *S')``; padding counts as zeros."""


@dataclasses.dataclass(frozen=True, eq=False)
class GlobalAvgPool(Layer):
    """Mean over every spatial axis: ``(N, C, *S) -> (N, C)``."""


@dataclasses.dataclass(frozen=True, eq=False)
class GlobalMaxPool(Layer):
    """Max over every spatial axis: ``(N, C, *S) -> (N, C)``."""


@dataclasses.dataclass(frozen=True, eq=False)
class Reshape(Layer):
    """Reshapes to `shape`, given here or at call time: ``self.flat(x, (-1, 256))``."""

    shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.shape is not None:
            shape = _items(self.shape)
            ok = bool(shape) and all(_is_int(n) and (n >= 0 or n == -1) for n in shape)
            if not ok or sum(n == -1 for n in shape) > 1:
                raise bad_argument(
                    "shape", self.shape, "None or a tuple of ints >= 0 with at most one -1"
                )
            object.__setattr__(self, "shape", tuple(int(n) for n in shape))


@dataclasses.dataclass(frozen=True, eq=False)
class Flatten(Layer):
    """Flattens axes `start` onwards: ``(N, C, H, W) -> (N, C·H·W)`` with start=1."""

    start: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", check_int("start", self.start))


@dataclasses.dataclass(frozen=True, eq=False)
class BatchNorm(Layer):
    """Batch normalization over axis 1 of ``(N, C, ...)``; torch's momentum convention.

    Training normalizes with the batch's biased variance and updates the running statistics
    (``running = (1 - momentum)·running + momentum·batch``, unbiased variance); evaluation
    uses the running statistics.
    """

    num_features: int
    eps: float = 1e-5
    momentum: float = 0.1
    affine: bool = True

    def __post_init__(self) -> None:
        _positive(self, "num_features")
        _eps(self)
        # torch's momentum=None (a cumulative average) is not offered: name it clearly.
        momentum = check_finite("momentum", self.momentum, 0.0, 1.0, expected="a float in [0, 1]")
        object.__setattr__(self, "momentum", momentum)
        _flags(self, "affine")

    def params(self) -> dict[str, ParamSpec]:
        c = (self.num_features,)
        out = {}
        if self.affine:
            out = {"weight": ParamSpec(c, "ones"), "bias": ParamSpec(c, "zeros")}
        out["running_mean"] = ParamSpec(c, "zeros", trainable=False)
        out["running_var"] = ParamSpec(c, "ones", trainable=False)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class LayerNorm(Layer):
    """Normalizes over the trailing axes given by `shape`."""

    shape: Any
    eps: float = 1e-5
    affine: bool = True

    def __post_init__(self) -> None:
        shape = (self.shape,) if _is_int(self.shape) else _items(self.shape)
        if not shape or not all(_is_int(n) and n > 0 for n in shape):
            raise bad_argument("shape", self.shape, "a positive int or a tuple of them")
        object.__setattr__(self, "shape", tuple(int(n) for n in shape))
        _eps(self)
        _flags(self, "affine")

    def params(self) -> dict[str, ParamSpec]:
        if not self.affine:
            return {}
        shape = self.shape
        return {"weight": ParamSpec(shape, "ones"), "bias": ParamSpec(shape, "zeros")}


@dataclasses.dataclass(frozen=True, eq=False)
class Dropout(Layer):
    """Zeroes each element with probability `p` in training, scaling the rest by 1/(1-p).

    The masks come from each framework's own generator (torch's, or the `rng` key given to
    JAX's apply): training-mode outputs differ between backends; evaluation is identity.
    """

    p: float = 0.5

    def __post_init__(self) -> None:
        p = check_finite("p", self.p, 0.0, 1.0, high_open=True, expected="a float in [0, 1)")
        object.__setattr__(self, "p", p)


@dataclasses.dataclass(frozen=True, eq=False)
class Embedding(Layer):
    """Looks rows up: int ids ``(...)`` -> ``(..., dim)``."""

    num_embeddings: int
    dim: int

    def __post_init__(self) -> None:
        _positive(self, "num_embeddings", "dim")

    def params(self) -> dict[str, ParamSpec]:
        return {"weight": ParamSpec((self.num_embeddings, self.dim), "normal", 1.0)}


class Sequential(Layer):
    """Layers (or Crafts) applied in order; their parameters are named ``seq.0.weight``."""

    layers: tuple[Any, ...]

    def __init__(self, *layers: Any) -> None:
        if not layers:
            raise bad_argument("layers", layers, "at least one layer")
        object.__setattr__(self, "layers", tuple(layers))

    def __call__(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x


@dataclasses.dataclass(frozen=True, eq=False)
class Native(Layer):
    """A framework-native function held by a Craft: ``dock.Native(fn, backend="jax")``.

    It runs only when the Craft is realized under `backend`; the other backend refuses the
    Craft, naming this layer. (A torch ``nn.Module`` assigned to a Craft is recognized as
    native without this wrapper.)
    """

    fn: Any
    backend: str

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise bad_argument("fn", self.fn, "a callable")
        if self.backend not in ("torch", "jax"):
            raise bad_argument("backend", self.backend, "'torch' or 'jax'")

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return binding.current("Native").native(self, *inputs, **kwargs)
