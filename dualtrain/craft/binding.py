"""Which backend runs a Craft's layers right now.

A Craft is a description. While a realized module runs (torch `forward`, JAX `apply`, or
the NumPy reference), it installs a *binding* here, and each dock layer called inside
`Craft.run` asks the binding to run it. The binding lives in a context variable, so nested
and concurrent runs (threads, JAX tracing) each see their own.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Protocol

from dualtrain.craft import checks
from dualtrain.errors import NotRealizedError
from dualtrain.scoping import scoped

__all__ = ["Binding", "NotRealizedError", "active", "current", "peek", "run_bound"]


class Binding(Protocol):
    """What a backend provides to run a Craft's layers."""

    def layer(self, layer: Any, *inputs: Any, **kwargs: Any) -> Any:
        """Runs dock layer `layer` (a spec of `dualtrain.craft.dock`) on `inputs`."""

    def native(self, obj: Any, *inputs: Any, **kwargs: Any) -> Any:
        """Runs a framework-native module or function held by the Craft."""


_current: contextvars.ContextVar[Binding | None] = contextvars.ContextVar(
    "dualtrain_binding", default=None
)

# The active binding or None: the context variable's own `get`, a C call (a layer call
# reads it; `current` adds the error for a call outside a realized module).
peek = _current.get


def current(what: str) -> Binding:
    """The active binding; `what` names the caller for the error when there is none."""
    binding = _current.get()
    if binding is None:
        raise NotRealizedError(
            f"{what} was called outside a realized module. A Craft is a description: run it "
            "with dualtrain_torch.realize(craft), dualtrain_jax.realize(craft), or "
            "dualtrain.craft.reference_forward(craft, params, *inputs)"
        )
    return binding


def active(binding: Binding) -> contextlib.AbstractContextManager[None]:
    """Installs `binding` for the duration of the block."""
    return scoped(_current, binding)


def run_bound(binding: Binding, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with `binding` installed: `active` without a generator.

    A forward pass calls this once per call; the context manager's generator cost 1-2 µs.
    """
    token = _current.set(binding)
    try:
        return fn(*args, **kwargs)
    finally:
        _current.reset(token)


class LayerView:
    """What a functional layer implementation sees: its parameters, mode, RNG and state."""

    __slots__ = ("_binding", "_name")

    def __init__(self, functional: FunctionalBinding, name: str) -> None:
        self._binding, self._name = functional, name

    def __getitem__(self, local: str) -> Any:
        key = f"{self._name}.{local}"
        b = self._binding
        return b.new_state[key] if key in b.new_state else b.params[key]

    def get(self, local: str, default: Any = None) -> Any:
        """The array under `local`, or `default` where the layer has none."""
        if local not in self:
            return default
        return self[local]

    def __contains__(self, local: str) -> bool:
        key = f"{self._name}.{local}"
        return key in self._binding.params or key in self._binding.new_state

    @property
    def train(self) -> bool:
        """Training mode (BatchNorm batch statistics, Dropout masks)."""
        return self._binding.train

    def rng(self) -> Any:
        """A fresh random generator or key for this call (Dropout masks)."""
        return self._binding.next_rng(self._name)

    def update(self, local: str, value: Any) -> None:
        """Sets state tensor `local` (running statistics) for the rest of the run."""
        self._binding.new_state[f"{self._name}.{local}"] = value


class FunctionalBinding:
    """Runs layers as pure functions of ``params`` and ``state`` dicts keyed by neutral name.

    The NumPy reference and JAX both run this way; each supplies `table`, which maps a dock
    layer class to ``fn(layer, view, *inputs, **kwargs) -> output``, and `rng`, which makes
    a fresh generator or key from a counter, and may supply `canonical`, which maps a dtype
    to the dtype it computes in (JAX without x64: float64 -> float32), so the dtype check
    sees what will run; None checks dtypes as they are (NumPy).
    """

    def __init__(
        self,
        craft: Any,
        table: dict[type, Any],
        params: dict[str, Any],
        state: dict[str, Any],
        *,
        train: bool,
        rng: Any,
        canonical: Any = None,
    ) -> None:
        self.names = craft.layer_names()
        self.canonical = canonical
        self.table, self.params, self.train = table, params, train
        self.new_state = dict(state)
        self._rng, self._count = rng, 0

    def next_rng(self, name: str) -> Any:
        if self._rng is None:
            raise ValueError(f"layer {name!r} needs randomness in training mode; pass rng=")
        self._count += 1
        return self._rng(self._count)

    def layer(self, layer: Any, *inputs: Any, **kwargs: Any) -> Any:
        name = self.names.get(id(layer))
        if name is None:
            raise NotRealizedError(
                f"a {type(layer).__name__} layer was called that is not an attribute of the "
                "Craft being run; assign layers in __init__ so they are named and realized"
            )
        view = LayerView(self, name)
        if inputs:
            layer.check_input(*inputs, train=self.train, **kwargs)
            dtype = checks.params_dtype(layer, view.get, self.canonical)
            layer.check_dtype(inputs[0], dtype, train=self.train, canonical=self.canonical)
        return self.table[type(layer)](layer, view, *inputs, **kwargs)

    def native(self, obj: Any, *inputs: Any, **kwargs: Any) -> Any:
        return obj.fn(*inputs, **kwargs)
