"""The NumPy reference: every dock layer and op written plainly, the oracle of the tests.

`reference_forward(craft, params, *inputs)` runs a whole Craft in NumPy. The code favours
being obviously right over speed (float64 in, float64 out).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from dualtrain.craft import binding, dock
from dualtrain.craft.numpy_ops import OPS as OPS  # the NumPy ops, public here too
from dualtrain.craft.padding import resolve_padding
from dualtrain.validate import check_seed

__all__ = ["LAYERS", "OPS", "reference_forward"]


def reference_forward(
    craft: Any,
    params: dict[str, np.ndarray],
    *inputs: Any,
    state: dict[str, np.ndarray] | None = None,
    train: bool = False,
    seed: int = 0,
) -> tuple[Any, dict[str, np.ndarray]]:
    """Runs `craft` in NumPy; returns its outputs and the new state (running statistics).

    Args:
        craft: the Craft.
        params: every parameter (and state, unless `state` is given) by neutral name, e.g.
            from ``craft.init(seed)``.
        inputs: NumPy arrays.
        state: state tensors by name; by default taken from `params`.
        train: training mode (batch statistics, dropout).
        seed: seeds the dropout masks, an int in [0, 2**64).
    """
    seed = check_seed("seed", seed)
    natives = [name for name, part in craft.natives()]
    if natives:
        raise TypeError(f"the NumPy reference cannot run native layers: {natives}")
    specs = craft.param_specs()
    if state is None:
        state = {k: v for k, v in params.items() if not specs[k].trainable}
    bound = binding.FunctionalBinding(
        craft,
        LAYERS,
        params,
        state,
        train=train,
        rng=lambda i: np.random.default_rng([seed, i]),
    )
    with binding.active(bound):
        out = craft.run(*inputs)
    return out, bound.new_state


class _Wide:
    """A layer's parameters, float16 and bfloat16 ones read as float32."""

    __slots__ = ("p",)

    def __init__(self, p: Any) -> None:
        self.p = p

    def __getitem__(self, local: str) -> np.ndarray:
        return _wide(self.p[local])


def _wide(a: np.ndarray) -> np.ndarray:
    # NumPy has no bfloat16 matmul or einsum, and float16 ones round every partial sum:
    # compute in float32, as torch and XLA accumulate, and round the result once.
    return a.astype(np.float32) if a.dtype.name in ("float16", "bfloat16") else a


def _in_input_dtype(fn: Any) -> Any:
    """`fn` run on float32 copies of low-precision floats, its output in the input's dtype."""

    def run(layer: Any, p: Any, x: np.ndarray) -> np.ndarray:
        return np.asarray(fn(layer, _Wide(p), _wide(x))).astype(x.dtype, copy=False)

    return run


@_in_input_dtype
def _dense(layer: dock.Dense, p: Any, x: np.ndarray) -> np.ndarray:
    y = x @ p["weight"].T
    return y + p["bias"] if layer.bias else y


def _windows(x: np.ndarray, kernel: tuple, stride: tuple, dilation: tuple) -> np.ndarray:
    """Strided, dilated windows over the trailing spatial axes: (N, C, *out, *kernel)."""
    nd = len(kernel)
    span = [d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True)]
    win = sliding_window_view(x, span, axis=tuple(range(2, 2 + nd)))
    index: tuple[slice, ...] = (slice(None), slice(None))
    index += tuple(slice(None, None, s) for s in stride) + tuple(
        slice(None, None, d) for d in dilation
    )
    return win[index]


@_in_input_dtype
def _conv(layer: dock.Conv, p: Any, x: np.ndarray) -> np.ndarray:
    k, s, d = layer.kernel, layer.stride, layer.dilation
    pads = resolve_padding(layer.padding, x.shape[2:], k, s, d)
    xp = np.pad(x, [(0, 0), (0, 0), *pads])
    win = _windows(xp, k, s, d)
    n, c, g = x.shape[0], x.shape[1], layer.groups
    out_sizes = win.shape[2 : 2 + layer.ndim]
    win = win.reshape(n, g, c // g, *win.shape[2:])
    w = p["weight"].reshape(g, layer.out_channels // g, c // g, *k)
    sp, kk = "xyz"[: layer.ndim], "XYZ"[: layer.ndim]  # clear of the n, g, c, f axes
    y = np.einsum(f"ngc{sp}{kk},gfc{kk}->ngf{sp}", win, w).reshape(
        n, layer.out_channels, *out_sizes
    )
    if layer.bias:
        y = y + p["bias"].reshape(1, -1, *([1] * layer.ndim))
    return y


@_in_input_dtype
def _conv_transpose(layer: dock.ConvTranspose, p: Any, x: np.ndarray) -> np.ndarray:
    (kh, kw), (sh, sw) = layer.kernel, layer.stride
    (dh, dw), (ph, pw) = layer.dilation, layer.padding
    oph, opw = layer.output_padding
    n, c, h, w_ = x.shape
    g, fo = layer.groups, layer.out_channels // layer.groups
    full_h, full_w = (h - 1) * sh + dh * (kh - 1) + 1 + oph, (w_ - 1) * sw + dw * (kw - 1) + 1 + opw
    y = np.zeros((n, g, fo, full_h, full_w), dtype=np.result_type(x, p["weight"]))
    xg = x.reshape(n, g, c // g, h, w_)
    wg = p["weight"].reshape(g, c // g, fo, kh, kw)
    for i in range(kh):
        for j in range(kw):
            contrib = np.einsum("ngchw,gcf->ngfhw", xg, wg[:, :, :, i, j])
            y[
                :,
                :,
                :,
                i * dh : i * dh + (h - 1) * sh + 1 : sh,
                j * dw : j * dw + (w_ - 1) * sw + 1 : sw,
            ] += contrib
    out_h = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    out_w = (w_ - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    y = y.reshape(n, g * fo, full_h, full_w)[:, :, ph : ph + out_h, pw : pw + out_w]
    if layer.bias:
        y = y + p["bias"].reshape(1, -1, 1, 1)
    return y


def _pool(layer: Any, x: np.ndarray, fill: float, reduce: Any) -> np.ndarray:
    xp = np.pad(x, [(0, 0), (0, 0), *((q, q) for q in layer.padding)], constant_values=fill)
    win = _windows(xp, layer.kernel, layer.stride, (1,) * layer.ndim)
    return reduce(win, axis=tuple(range(-layer.ndim, 0)))


def _max_pool(layer: dock.MaxPool, p: Any, x: np.ndarray) -> np.ndarray:
    return _pool(layer, x, -np.inf, np.max)


def _avg_pool(layer: dock.AvgPool, p: Any, x: np.ndarray) -> np.ndarray:
    return _pool(layer, x, 0.0, np.mean)  # padding counts, as torch's count_include_pad


def _batch_norm(layer: dock.BatchNorm, p: Any, x: np.ndarray) -> np.ndarray:
    axes = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if p.train:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        n = x.size // x.shape[1]
        m = layer.momentum
        p.update("running_mean", (1 - m) * p["running_mean"] + m * mean)
        p.update("running_var", (1 - m) * p["running_var"] + m * var * n / max(n - 1, 1))
    else:
        mean, var = p["running_mean"], p["running_var"]
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + layer.eps)
    if layer.affine:
        y = y * p["weight"].reshape(shape) + p["bias"].reshape(shape)
    return y.astype(x.dtype, copy=False)


@_in_input_dtype
def _layer_norm(layer: dock.LayerNorm, p: Any, x: np.ndarray) -> np.ndarray:
    axes = tuple(range(-len(layer.shape), 0))
    y = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(
        x.var(axis=axes, keepdims=True) + layer.eps
    )
    return y * p["weight"] + p["bias"] if layer.affine else y


def _dropout(layer: dock.Dropout, p: Any, x: np.ndarray) -> np.ndarray:
    if not p.train or layer.p == 0:
        return x
    keep = p.rng().random(x.shape) >= layer.p
    return np.where(keep, x / (1 - layer.p), 0).astype(x.dtype, copy=False)


def _embedding(layer: dock.Embedding, p: Any, ids: np.ndarray) -> np.ndarray:
    return p["weight"][np.asarray(ids)]  # ids were range-checked by `check_input`


def _reshape(layer: dock.Reshape, p: Any, x: Any, shape: Any = None) -> Any:
    # `shape`: the one given at the call (``layer(x, shape)``), else the layer's own.
    return x.reshape(shape if shape is not None else layer.shape)


# Layers written with array methods only (mean, max, reshape): any array library's arrays run
# them as they are, so the JAX adapter's table takes these entries too.
ARRAY_METHOD_LAYERS: dict[type, Any] = {
    dock.Reshape: _reshape,
    dock.GlobalAvgPool: lambda layer, p, x: x.mean(axis=tuple(range(2, x.ndim))),
    dock.GlobalMaxPool: lambda layer, p, x: x.max(axis=tuple(range(2, x.ndim))),
    # the size spelled out: reshape(..., -1) cannot infer it when another axis is empty
    dock.Flatten: lambda layer, p, x: x.reshape(
        *x.shape[: layer.start], math.prod(x.shape[layer.start :])
    ),
}

LAYERS: dict[type, Any] = {
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
