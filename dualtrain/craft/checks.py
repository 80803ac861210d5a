"""Input-check helpers for the dock layer specs, shared so errors read the same everywhere.

Each dock spec checks its own inputs in ``check_input(x, *rest, train=..., **kwargs)`` (see
`dualtrain.craft.specs`), and every binding calls it before running a layer, so torch, JAX
and the NumPy reference refuse the same inputs with the same error class and message. This
module holds the pieces those methods share (rank, channels, windows, reshape sizes, ids);
it imports no spec, so the specs depend on it and nothing here depends back.

Under JAX tracing the shapes are static, so a check runs once, at trace time; values
(Embedding ids) are checked only where they are concrete (see `concrete`, `check_ids`).
"""

from __future__ import annotations

import math
import sys
import weakref
from typing import Any

import numpy as np

from dualtrain.errors import DtypeError, OutOfRangeError, ShapeError

__all__ = [
    "INPUT_DTYPES",
    "check",
    "check_channels",
    "check_dtype",
    "check_ids",
    "check_not_empty",
    "check_rank",
    "check_reshape",
    "check_windows",
    "concrete",
    "dtype_name",
    "params_dtype",
]


def check(layer: Any, x: Any, *rest: Any, train: bool = False, **kwargs: Any) -> None:
    """Runs ``layer.check_input(x, *rest, train=train, **kwargs)``; kept for older callers.

    Raises:
        ShapeError, DtypeError, OutOfRangeError: what the layer's own check raises.
    """
    layer.check_input(x, *rest, train=train, **kwargs)


# What a layer's `input_dtypes` may say: the dtype rule of its first input.
INPUT_DTYPES = ("params", "float", "float_in_train", "any")
_FLOATS = ("float16", "bfloat16", "float32", "float64")
# `params_dtype`'s local names per spec (specs hash by identity and live as long as a Craft).
_PARAM_NAMES: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()
# What torch autocast (CPU and CUDA) casts or mixes into float32 parameters: float64 is
# never eligible for an autocast cast, so it reaches the kernel as it is and fails there.
_AUTOCAST = ("float32", "float16", "bfloat16")


def dtype_name(x: Any) -> str:
    """``"float32"``: the dtype of a NumPy, torch or JAX array by its common name."""
    return str(x.dtype).removeprefix("torch.")


def params_dtype(layer: Any, get: Any, canonical: Any = None) -> Any:
    """The dtype of `layer`'s first floating parameter or state, or None (only for "params").

    `get(local)` returns the array a binding holds under a local name (``weight``), or None.
    `canonical` maps a dtype to the one the backend computes in (see `check_dtype`).
    """
    if layer.input_dtypes != "params":
        return None
    # Called on every layer call under torch: the names are worked out once per spec (a
    # spec is frozen), not by building its ParamSpecs again.
    names = _PARAM_NAMES.get(layer)
    if names is None:
        names = _PARAM_NAMES[layer] = tuple(layer.params())
    for local in names:
        value = get(local)
        if value is not None:
            computed = _computed(value, canonical)
            if computed in _FLOATS:
                return computed
    return None


def _computed(x: Any, canonical: Any) -> str:
    """The name of the dtype `x` is computed in: its own, or ``canonical(x.dtype)``."""
    if canonical is None:
        return dtype_name(x)
    return str(canonical(x.dtype)).removeprefix("torch.")


def check_dtype(
    layer: Any, x: Any, params_dtype: Any, *, train: bool = False, canonical: Any = None
) -> None:
    """Refuses an input whose dtype `layer` does not take: the same rule under every backend.

    The rule is the layer's ``input_dtypes``:

    * ``"params"`` (Dense, Conv, ConvTranspose, BatchNorm, LayerNorm): the dtype of the
      layer's parameters (the ``dtype`` it was realized with, or the dtype of the params
      passed to ``apply``). Nothing is promoted: torch refuses a mix, and JAX would compute
      silently in another precision. Under torch autocast, float32 parameters take a
      float32, float16 or bfloat16 input (autocast casts it, or the norm kernels mix it);
      float64 is never cast by autocast, so it is refused there too. A layer without
      parameters (LayerNorm(affine=False)) takes "float".
    * ``"float"`` (AvgPool, MaxPool, GlobalAvgPool): any floating dtype, kept in the output.
    * ``"float_in_train"`` (Dropout): any dtype in evaluation (identity), a floating one in
      training, where values are scaled by ``1/(1-p)``.
    * ``"any"``: every dtype (Reshape, Flatten, GlobalMaxPool). Embedding's integer ids
      are checked by its `check_input`.

    Args:
        layer: the dock spec.
        x: its first input (NumPy, torch or JAX array, or a tracer: only its dtype is read).
        params_dtype: the dtype of the layer's floating parameters or state, or None
            (`params_dtype`).
        train: training mode.
        canonical: maps a dtype to the dtype the backend computes it in, or None (as it
            is). JAX without x64 computes float64 as float32 and int64 as int32, so its
            binding passes ``jax.dtypes.canonicalize_dtype``: the check sees what runs.

    Raises:
        DtypeError: naming the layer, the input's dtype and the dtypes it takes.
    """
    rule = layer.input_dtypes
    if rule == "any" or (rule == "float_in_train" and not train):
        return
    got = _computed(x, canonical)
    if rule == "params" and got == params_dtype:
        return  # the common case, taken under autocast too: nothing to cast or refuse
    name = type(layer).__name__
    given = dtype_name(x)
    shown = got if given == got else f"{given} (computed as {got})"
    if rule == "params" and params_dtype is not None:
        expected = str(params_dtype).removeprefix("torch.")
        autocast = _autocast(x)
        if autocast and expected == "float32" and got in _AUTOCAST:
            return
        if autocast and expected == "float32":
            # Autocast never casts float64 (nor ints): torch would fail with a raw
            # dtype-mismatch error inside the kernel.
            raise DtypeError(
                f"{name} takes a float32, float16 or bfloat16 input under torch autocast (its "
                f"parameters are float32); got dtype {shown}: cast the input to float32"
            )
        if got != expected:
            fix = f"cast the input to {expected}"
            if got in _FLOATS and not autocast:
                fix += f", or realize the Craft with dtype={got!r}"
            where = " (under torch autocast too)" if autocast else ""
            raise DtypeError(
                f"{name} takes inputs of its parameters' dtype {expected}{where}; got dtype "
                f"{shown}: {fix}"
            )
        return
    if got not in _FLOATS:
        raise DtypeError(f"{name} takes a floating input ({', '.join(_FLOATS)}); got dtype {shown}")


def _autocast(x: Any) -> bool:
    """Whether torch autocast is on for `x`'s device (then torch casts inputs itself)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return False
    return bool(torch.is_autocast_enabled(x.device.type))


def concrete(x: Any) -> Any:
    """`x`'s values as they can be read now, or None where they cannot.

    None for a JAX tracer and inside torch.compile; a tensor under ``torch.func``
    transforms (vmap, grad) is unwrapped to the tensor it wraps, which holds every
    vmapped slice's values. Checked through ``sys.modules``: the core never imports a
    framework itself.
    """
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.core.Tracer):
        return None
    torch = sys.modules.get("torch")
    if torch is None:
        return x
    if torch.compiler.is_compiling():
        return None
    functorch = torch._C._functorch
    while isinstance(x, torch.Tensor) and functorch.is_functorch_wrapped_tensor(x):
        x = functorch.get_unwrapped(x)
    return x


def check_ids(ids: Any, num: int, name: str) -> None:
    """Raises OutOfRangeError naming the first id outside ``[0, num)`` and its position.

    `ids` is any integer array (NumPy, torch, JAX); a device array is read once to the host
    for its minimum and maximum.
    """
    size = math.prod(tuple(ids.shape))
    if not size:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo >= 0 and hi < num:
        return
    flat = np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids).ravel()
    bad = int(np.flatnonzero((flat < 0) | (flat >= num))[0])
    position = tuple(int(i) for i in np.unravel_index(bad, tuple(ids.shape)))
    raise OutOfRangeError(
        f"{name} holds id {int(flat[bad])} at position {position}; expected ids in [0, {num})"
    )


def check_rank(name: str, shape: tuple[int, ...], rank: int, form: str) -> None:
    """Raises ShapeError unless `shape` has `rank` axes; `form` names them, ``(N, C, H, W)``."""
    if len(shape) != rank:
        raise ShapeError(f"{name} takes {form}, rank {rank}; got shape {shape}")


def check_not_empty(name: str, shape: tuple[int, ...], axes: range, what: str) -> None:
    """Raises ShapeError if an axis of `axes` is empty; `what` names them (``"channel axis"``).

    An empty batch (axis 0) runs everywhere and gives an empty output; an empty axis a
    reduction or a window needs has no answer (torch, JAX and NumPy fail three ways), so
    it is refused here, the same under every backend.
    """
    if any(shape[a] == 0 for a in axes if a < len(shape)):
        raise ShapeError(f"{name} takes a non-empty {what}; got shape {shape}")


def check_channels(name: str, shape: tuple[int, ...], expected: int) -> None:
    """Raises ShapeError unless axis 1 of `shape` holds `expected` channels."""
    if len(shape) < 2 or shape[1] != expected:
        raise ShapeError(f"{name} takes {expected} channels on axis 1; got shape {shape}")


def check_windows(
    name: str,
    shape: tuple[int, ...],
    pads: tuple[tuple[int, int], ...],
    kernel: tuple[int, ...],
    dilation: tuple[int, ...],
) -> None:
    """Each padded spatial axis holds at least one (dilated) window: an output size >= 1.

    Args:
        name: the layer's name for the message.
        shape: the input's shape, ``(N, C, *spatial)``.
        pads: ``(low, high)`` padding per spatial axis, resolved.
        kernel: the window per spatial axis.
        dilation: the dilation per spatial axis (ones for pooling).
    """
    spatial = shape[2:]
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(spatial, pads, strict=True))
    span = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True))
    if any(p < s for p, s in zip(padded, span, strict=True)):
        raise ShapeError(
            f"{name} gives no output for input shape {shape}: the padded "
            f"spatial size {padded} is smaller than the (dilated) kernel {span}"
        )


def check_reshape(target: Any, shape: tuple[int, ...]) -> None:
    """Raises ShapeError unless `target` is a shape the input's values fill exactly.

    At most one ``-1`` is inferred; `target` is a tuple or list of ints >= -1.
    """
    size = math.prod(shape)
    items = tuple(target) if isinstance(target, (tuple, list)) else None
    ok = items is not None and all(
        isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= -1 for n in items
    )
    if ok and items is not None:
        known = math.prod(int(n) for n in items if n != -1)
        holes = sum(1 for n in items if n == -1)
        ok = (holes == 0 and known == size) or (holes == 1 and known > 0 and size % known == 0)
    if not ok:
        raise ShapeError(
            f"Reshape cannot make shape {target!r} from an input of shape {shape} ({size} values)"
        )
