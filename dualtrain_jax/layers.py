"""Each dock spec as a pure JAX function of its parameters, and the functional ops.

``LAYERS[type(spec)](spec, view, x)`` computes one layer; `view` (a
`dualtrain.craft.binding.LayerView`) gives the layer's parameters by local name, the mode,
a PRNG key and a way to write new state. Parameters keep the canonical layouts, which JAX's
contractions take as they are (``(out, in)`` Dense weights, ``OIHW`` kernels, ``NCHW`` data).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dualtrain.craft import dock
from dualtrain.craft.padding import resolve_padding
from dualtrain.craft.reference import ARRAY_METHOD_LAYERS

__all__ = ["LAYERS", "OPS"]

_SPATIAL = {1: "H", 2: "HW", 3: "DHW"}


def _numbers(nd: int) -> tuple[str, str, str]:
    s = _SPATIAL[nd]
    return f"NC{s}", f"OI{s}", f"NC{s}"


def _dense(spec: dock.Dense, p: Any, x: jax.Array) -> jax.Array:
    # Contract x's last axis with the (out, in) weight's axis 1: no transpose is materialized.
    y = lax.dot_general(x, p["weight"], (((x.ndim - 1,), (1,)), ((), ())))
    return y + p["bias"] if spec.bias else y


def _conv(spec: dock.Conv, p: Any, x: jax.Array) -> jax.Array:
    pads = resolve_padding(spec.padding, x.shape[2:], spec.kernel, spec.stride, spec.dilation)
    y = lax.conv_general_dilated(
        x, p["weight"], spec.stride, pads, rhs_dilation=spec.dilation,
        dimension_numbers=_numbers(spec.ndim), feature_group_count=spec.groups,
        precision=lax.Precision.HIGHEST,
    )  # fmt: skip
    if spec.bias:
        y = y + p["bias"].reshape(1, -1, *([1] * spec.ndim))
    return y


def _conv_transpose(spec: dock.ConvTranspose, p: Any, x: jax.Array) -> jax.Array:
    # torch's transposed convolution = a convolution of the stride-dilated input with the
    # spatially flipped kernel, whose in/out axes swap within each group.
    w = p["weight"]
    g = spec.groups
    cin, fo, kh, kw = w.shape
    w = (
        w.reshape(g, cin // g, fo, kh, kw)
        .transpose(0, 2, 1, 3, 4)
        .reshape(g * fo, cin // g, kh, kw)
    )
    w = w[:, :, ::-1, ::-1]
    pads = [
        (d * (k - 1) - pad, d * (k - 1) - pad + op)
        for k, d, pad, op in zip(
            spec.kernel, spec.dilation, spec.padding, spec.output_padding, strict=True
        )
    ]
    y = lax.conv_general_dilated(
        x, w, (1, 1), pads, lhs_dilation=spec.stride, rhs_dilation=spec.dilation,
        dimension_numbers=_numbers(2), feature_group_count=g, precision=lax.Precision.HIGHEST,
    )  # fmt: skip
    return y + p["bias"].reshape(1, -1, 1, 1) if spec.bias else y


def _pool(spec: Any, x: jax.Array, init: Any, op: Any) -> jax.Array:
    window = (1, 1, *spec.kernel)
    strides = (1, 1, *spec.stride)
    pads = ((0, 0), (0, 0), *((q, q) for q in spec.padding))
    return lax.reduce_window(x, init, op, window, strides, pads)


# Python scalars as init values: JAX recognizes (-inf, max) and (0, add) as monoids, which
# have gradients; an array init turns into a tracer under jit and loses them.
def _max_pool(spec: dock.MaxPool, p: Any, x: jax.Array) -> jax.Array:
    return _pool(spec, x, -float("inf"), lax.max)


def _avg_pool(spec: dock.AvgPool, p: Any, x: jax.Array) -> jax.Array:
    total = _pool(spec, x, 0.0, lax.add)
    size = 1
    for k in spec.kernel:
        size *= k
    return total / size  # padding counts, as torch's count_include_pad


def _batch_norm(spec: dock.BatchNorm, p: Any, x: jax.Array) -> jax.Array:
    axes = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if p.train:
        mean = x.mean(axis=axes)
        var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)
        n = x.size // x.shape[1]
        m = spec.momentum
        p.update("running_mean", (1 - m) * p["running_mean"] + m * lax.stop_gradient(mean))
        unbiased = lax.stop_gradient(var) * n / max(n - 1, 1)
        p.update("running_var", (1 - m) * p["running_var"] + m * unbiased)
    else:
        mean, var = p["running_mean"], p["running_var"]
    y = (x - mean.reshape(shape)) * lax.rsqrt(var.reshape(shape) + spec.eps)
    return y * p["weight"].reshape(shape) + p["bias"].reshape(shape) if spec.affine else y


def _layer_norm(spec: dock.LayerNorm, p: Any, x: jax.Array) -> jax.Array:
    axes = tuple(range(-len(spec.shape), 0))
    mean = x.mean(axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    y = (x - mean) * lax.rsqrt(var + spec.eps)
    return y * p["weight"] + p["bias"] if spec.affine else y


def _dropout(spec: dock.Dropout, p: Any, x: jax.Array) -> jax.Array:
    if not p.train or spec.p == 0:
        return x
    keep = jax.random.bernoulli(p.rng(), 1 - spec.p, x.shape)
    return jnp.where(keep, x / (1 - spec.p), 0).astype(x.dtype)


def _embedding(spec: dock.Embedding, p: Any, ids: jax.Array) -> jax.Array:
    # Concrete ids were range-checked by `check_input` (an OutOfRangeError, as torch).
    # Traced ids cannot raise: an id outside [0, num), negative included, gives a row of
    # NaN rather than another row (jnp.take would read id -1 as the last row).
    num = spec.num_embeddings
    ids = jnp.where(ids < 0, num, ids)
    return jnp.take(p["weight"], ids, axis=0, mode="fill", fill_value=jnp.nan)


def _jax_input(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with a NumPy input made a JAX array first, after the binding's checks.

    Without it, layers written with array methods (``x.mean``, ``x.reshape``, Dropout's
    identity) computed a NumPy float64 input in NumPy, as float64, while Dense computed it
    as float32 (JAX without x64): every layer now computes in the dtype JAX gives it. The
    ids of an Embedding are range-checked before, so int64 -> int32 cannot wrap silently.
    """

    @functools.wraps(fn)
    def run(spec: Any, p: Any, x: Any, *rest: Any, **kwargs: Any) -> Any:
        if isinstance(x, (np.ndarray, np.generic)):
            x = jnp.asarray(x)
        return fn(spec, p, x, *rest, **kwargs)

    return run


_TABLE: dict[type, Callable[..., Any]] = {
    dock.Dense: _dense,
    dock.Conv: _conv,
    dock.ConvTranspose: _conv_transpose,
    dock.MaxPool: _max_pool,
    dock.AvgPool: _avg_pool,
    **ARRAY_METHOD_LAYERS,
    dock.BatchNorm: _batch_norm,
    dock.LayerNorm: _layer_norm,
    dock.Dropout: _dropout,
    dock.Embedding: _embedding,
}
LAYERS: dict[type, Callable[..., Any]] = {kind: _jax_input(fn) for kind, fn in _TABLE.items()}


def _cross_entropy(logits: Any, labels: Any) -> Any:
    # A label outside [0, K) (negative ones too, which indexing would wrap) picks NaN: its
    # value is unknown while tracing, so it cannot raise as NumPy and torch do.
    classes = logits.shape[-1]
    picked = jnp.where((labels < 0) | (labels >= classes), classes, labels).astype(jnp.int32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp, picked[:, None], axis=-1, mode="fill", fill_value=jnp.nan)
    return -chosen.mean()


OPS: dict[str, Callable[..., Any]] = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # JAX defaults to the tanh form
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "softmax": lambda x, axis: jax.nn.softmax(x, axis=axis),
    "log_softmax": lambda x, axis: jax.nn.log_softmax(x, axis=axis),
    "concat": lambda xs, axis: jnp.concatenate(xs, axis=axis),
    "add": jnp.add,
    "mean": lambda x, axis, keepdims: jnp.mean(x, axis=axis, keepdims=keepdims),
    "matmul": jnp.matmul,
    "pad": lambda x, pads, value: jnp.pad(
        x, ((0, 0),) * (x.ndim - len(pads)) + pads, constant_values=value
    ),
    "cross_entropy": _cross_entropy,
    "accuracy": lambda logits, labels: (
        (logits.argmax(-1) == labels)
        .astype(logits.dtype if jnp.issubdtype(logits.dtype, jnp.floating) else jnp.float32)
        .mean()
    ),
}
