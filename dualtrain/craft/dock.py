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


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise bad_argument(name, value, "a positive int")


def _check_channels(spec: Any) -> None:
    """Positive channel counts and groups, and groups dividing both (Conv, ConvTranspose)."""
    _positive("in_channels", spec.in_channels)
    _positive("out_channels", spec.out_channels)
    _positive("groups", spec.groups)
    if spec.in_channels % spec.groups or spec.out_channels % spec.groups:
        raise bad_argument(
            "groups",
            spec.groups,
            f"a divisor of in_channels={spec.in_channels} and out_channels={spec.out_channels}",
        )


def _ndim(kernel: object, ndim: int | None) -> int:
    if ndim is not None and ndim not in (1, 2, 3):
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
        _positive("in_features", self.in_features)
        _positive("out_features", self.out_features)

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
        object.__setattr__(self, "ndim", nd)
        for name in ("kernel", "stride", "dilation"):
            object.__setattr__(self, name, to_tuple(getattr(self, name), nd, name))
        check_padding(self.padding, nd)

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
            pair = (value, value) if isinstance(value, int) else tuple(value)
            if len(pair) != 2 or not all(isinstance(v, int) and v >= 0 for v in pair):
                raise bad_argument(name, value, "a non-negative int or 2 of them")
            object.__setattr__(self, name, pair)
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
        object.__setattr__(self, "ndim", nd)
        object.__setattr__(self, "kernel", to_tuple(self.kernel, nd, "kernel"))
        stride = self.kernel if self.stride is None else self.stride
        object.__setattr__(self, "stride", to_tuple(stride, nd, "stride"))
        pads = (self.padding,) * nd if isinstance(self.padding, int) else tuple(self.padding)
        ok = len(pads) == nd and all(isinstance(p, int) and p >= 0 for p in pads)
        if not ok or any(2 * p > k for p, k in zip(pads, self.kernel, strict=True)):
            raise bad_argument("padding", self.padding, "non-negative ints of at most kernel/2")
        object.__setattr__(self, "padding", pads)


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


@dataclasses.dataclass(frozen=True, eq=False)
class Flatten(Layer):
    """Flattens axes `start` onwards: ``(N, C, H, W) -> (N, C·H·W)`` with start=1."""

    start: int = 1


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
        _positive("num_features", self.num_features)
        if not self.eps > 0:
            raise bad_argument("eps", self.eps, "a positive float")
        if not 0 <= self.momentum <= 1:
            raise bad_argument("momentum", self.momentum, "a float in [0, 1]")

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
        shape = (self.shape,) if isinstance(self.shape, int) else tuple(self.shape)
        for n in shape:
            _positive("shape", n)
        object.__setattr__(self, "shape", shape)
        if not self.eps > 0:
            raise bad_argument("eps", self.eps, "a positive float")

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
        if not 0 <= self.p < 1:
            raise bad_argument("p", self.p, "a float in [0, 1)")


@dataclasses.dataclass(frozen=True, eq=False)
class Embedding(Layer):
    """Looks rows up: int ids ``(...)`` -> ``(..., dim)``."""

    num_embeddings: int
    dim: int

    def __post_init__(self) -> None:
        _positive("num_embeddings", self.num_embeddings)
        _positive("dim", self.dim)

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
