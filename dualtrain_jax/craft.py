"""A Craft realized as a JAX module: a pytree of parameters and state with a pure `apply`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dualtrain.craft import Craft, binding
from dualtrain.craft.realizable import check_realizable
from dualtrain.deprecation import positional_deprecated
from dualtrain.dtypes import name_of
from dualtrain.errors import DtypeError, bad_argument
from dualtrain.interop import convert
from dualtrain_jax.layers import LAYERS
from dualtrain_jax.transfer import parse_device

__all__ = ["JaxModule", "Nozzle", "Prober", "Rudder", "coat", "realize", "shell"]


@jax.tree_util.register_pytree_node_class
class JaxModule:
    """A realized Craft: ``params`` and ``state`` dicts keyed by neutral names, and `apply`.

    It is a lossless pytree: the leaves are params, then state; the static fields (the
    Craft and the `train` mode) travel in the tree's definition, so ``jit``, ``grad``,
    ``vmap`` and ``tree_map`` hand the function a module in the same mode.

    Mutability: the module is a mutable holder of immutable arrays. `Rudder`/`Prober`/
    `Nozzle`, ``__call__`` in training mode and ``TimeMachine.to`` rebind its fields on the
    same object (new arrays, never written in place); a JAX transformation works on a copy
    (flatten -> unflatten), so what it rebinds reaches the caller only by being returned.

    Attributes:
        params: trainable arrays, e.g. ``{"fc.weight": (in, out), ...}``.
        state: non-trainable arrays (BatchNorm running statistics).
        craft: the description.
        train: the mode ``__call__`` runs in (set by the contexts).
    """

    dualtrain_backend = "jax"

    def __init__(
        self, craft: Craft, params: dict[str, Any], state: dict[str, Any], train: bool = False
    ) -> None:
        self.craft, self.params, self.state = craft, params, state
        self.train = train

    def _statics(self) -> dict[str, Any]:
        """The static fields a subclass adds: keyword arguments of its ``__init__``.

        Flattening, unflattening and `replace` carry them, so a subclass (top-k backprop,
        an accelerated module) names them here once.
        """
        return {}

    def tree_flatten(self) -> tuple[tuple[Any, Any], tuple[Any, ...]]:
        # Every static field goes into the definition: anything left out would come back
        # at its default after jit/vmap/tree_map (the train mode did, once).
        extra = tuple(self._statics().items())
        return (self.params, self.state), (self.craft, bool(self.train), extra)

    @classmethod
    def tree_unflatten(cls, static: tuple[Any, ...], children: tuple[Any, Any]) -> JaxModule:
        craft, train, extra = static
        return cls(craft, *children, train=train, **dict(extra))

    def apply(
        self,
        params: dict[str, Any],
        state: dict[str, Any],
        *inputs: Any,
        train: bool = False,
        rng: jax.Array | None = None,
        **kwargs: Any,
    ) -> tuple[Any, dict[str, Any]]:
        """Runs the Craft: returns ``(outputs, new_state)``; pure, so jit/grad/vmap apply.

        Args:
            params: the parameters (differentiate with respect to these).
            state: the state; training mode returns its update.
            inputs: the Craft's inputs.
            train: batch statistics and dropout on.
            rng: a PRNG key, needed in training mode by Dropout.
            **kwargs: passed to ``run`` (e.g. a Reshape's shape).
        """
        fold = None if rng is None else (lambda i: jax.random.fold_in(rng, i))
        table = self._layer_table()
        # canonical: without x64 JAX computes float64 as float32 (int64 as int32), so the
        # dtype check compares the dtypes that will actually run.
        bound = binding.FunctionalBinding(
            self.craft,
            table,
            params,
            state,
            train=train,
            rng=fold,
            canonical=jax.dtypes.canonicalize_dtype,
        )
        with binding.active(bound):
            out = self.craft.run(*inputs, **kwargs)
        return out, bound.new_state

    def _layer_table(self) -> dict[type, Any]:
        # The hook a subclass uses to run some layers differently (top-k backprop).
        return LAYERS

    def __call__(self, *inputs: Any, rng: jax.Array | None = None) -> Any:
        out, new_state = self.apply(self.params, self.state, *inputs, train=self.train, rng=rng)
        if self.train:
            self.state = new_state
        return out

    def gear(self, gear: Any) -> JaxModule:
        """Nebulae's ``gear``: an Engine or device puts the arrays there; returns the module.

        The new arrays are rebound on this module, as the contexts rebind them. True / False
        set the training mode instead.
        """
        if isinstance(gear, (bool, np.bool_)):
            self.train = bool(gear)
            return self
        self.params, self.state = jax.device_put((self.params, self.state), parse_device(gear))
        return self

    def replace(self, **changes: Any) -> JaxModule:
        """A copy (of the same class, its static fields kept) with `params`/`state` replaced."""
        return type(self)(
            self.craft,
            changes.get("params", self.params),
            changes.get("state", self.state),
            train=self.train,
            **self._statics(),
        )

    def __repr__(self) -> str:
        count = sum(int(np.prod(v.shape)) for v in self.params.values())
        return (
            f"JaxModule({type(self.craft).__name__}, {len(self.params)} params, {count:,} values)"
        )


@positional_deprecated("dualtrain_jax.realize", ("seed", "dtype", "device"))
def realize(craft: Craft, *, seed: int = 0, device: Any = None, dtype: Any = None) -> JaxModule:
    """The Craft as a JAX module, initialized like `dualtrain_torch.realize` for the seed.

    Args:
        craft: the model description.
        seed: initialization seed, an int in [0, 2**64); the same seed gives the same
            weights under torch.
        device: a JAX device or sharding for the arrays, or a `dualtrain.Engine`; default
            the Engine the Craft was geared to (``craft.gear(engine)``), else JAX's default.
        dtype: floating dtype (float16, bfloat16, float32, float64; float64 needs
            ``jax.enable_x64``); None means float32.

    Positional `seed`, `dtype`, `device` (the previous release's order) still work with a
    ``DeprecationWarning``; they become keyword-only in the next release.

    Raises:
        TypeError: the Craft holds a torch-native layer (the message names it).
        ArgumentError: a bad seed, or a layer name that cannot be a parameter name.
        DtypeError: a dtype that is not floating.
    """
    check_realizable(craft, "jax")
    dtype = "float32" if dtype is None else dtype
    specs = craft.param_specs()
    if device is None:
        device = craft.geared
    values = convert(craft.init(seed, dtype), to="jax", device=device)
    params = {k: v for k, v in values.items() if specs[k].trainable}
    state = {k: v for k, v in values.items() if not specs[k].trainable}
    return JaxModule(craft, params, state)


class _Mode:
    train: bool

    def __init__(self, *modules: JaxModule) -> None:
        self.modules = modules

    def __enter__(self) -> bool:
        self._saved = [m.train for m in self.modules]
        for m in self.modules:
            m.train = self.train
        return self.train

    def __exit__(self, *exc: object) -> None:
        for m, was in zip(self.modules, self._saved, strict=True):
            m.train = was


class Rudder(_Mode):
    """Training mode for ``__call__`` (batch statistics, dropout); use ``jax.grad`` on apply."""

    train = True


class Prober(_Mode):
    """Evaluation mode, for inspection with ``jax.grad``; parameters are left unchanged."""

    train = False


class Nozzle(_Mode):
    """Evaluation mode for inference."""

    train = False


def coat(datum: Any, as_const: bool = True, device: Any = None, dtype: Any = None) -> jax.Array:
    """Any number, list or array as a JAX array on `device`.

    JAX arrays are all constants: `as_const` is accepted for symmetry with torch, and
    differentiation is ``jax.grad``'s business. It is checked as torch checks it, so code
    that runs under one adapter is refused the same way under the other.

    Raises:
        ArgumentError: `as_const` is not a bool.
        DtypeError: ``as_const=False`` for an array that is not floating.
    """
    if not isinstance(as_const, (bool, np.bool_)):
        raise bad_argument("as_const", as_const, "a bool")
    if isinstance(datum, (int, float, bool, list, tuple)) or np.isscalar(datum):
        out = jnp.asarray(datum, dtype=dtype)
    else:
        out = convert(datum, to="jax")
        out = out.astype(dtype) if dtype is not None else out
    if not as_const and not jnp.issubdtype(out.dtype, jnp.inexact):
        raise DtypeError(
            f"coat(as_const=False) makes a trainable array, which must be floating; got "
            f"{name_of(out.dtype)} (pass dtype='float32' or a float datum)"
        )
    return jax.device_put(out, parse_device(device)) if device is not None else out


def shell(datum: Any, as_np: bool = True) -> Any:
    """A JAX array (or pytree) back as NumPy (``as_np``) or as a host JAX array."""
    if as_np:
        out = convert(datum, to="numpy")
        return out.item() if isinstance(out, np.ndarray) and out.shape == () else out
    return jax.device_put(datum, jax.devices("cpu")[0])
