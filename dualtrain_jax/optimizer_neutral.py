"""optax state in neutral form: the families that cross to torch.optim, and their loading.

`neutral_view` maps optax's sgd, adam/adamw, rmsprop and adagrad states onto
``dualtrain.checkpoint.optim_state``'s families (slots by torch's names: ``trace`` is
``momentum_buffer``, ``mu``/``nu`` are ``exp_avg``/``exp_avg_sq``, naming the native tensors);
`check_neutral` validates neutral state against an optax state and returns its filler. The
native form is ``dualtrain_jax.optimizer_state``'s; ``dualtrain_torch.optimizer_neutral`` is
the torch twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualtrain.checkpoint.optim_state import FAMILIES, NotPortableError, OptimizerState
from dualtrain.errors import CheckpointError
from dualtrain_jax.craft import JaxModule

__all__ = ["check_neutral", "is_namedtuple", "neutral_view", "type_name"]

# optax states with a torch.optim counterpart, and the slots their fields fill.
_SLOTS: dict[type, dict[str, str]] = {
    optax.TraceState: {"trace": "momentum_buffer"},
    optax.ScaleByAdamState: {"mu": "exp_avg", "nu": "exp_avg_sq"},
    optax.ScaleByRmsState: {"nu": "square_avg"},
    optax.ScaleByRStdDevState: {"mu": "grad_avg", "nu": "square_avg"},
    optax.ScaleByRssState: {"sum_of_squares": "sum"},
}


def type_name(x: Any) -> str:
    """How messages and manifests name the type of an optax state node."""
    return type(x).__qualname__


def is_namedtuple(x: Any) -> bool:
    """Whether `x` is a NamedTuple (optax's states are), not a plain tuple."""
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _classify(opt_state: Any) -> tuple[str, dict[str, bool], list[tuple[str, Any]]]:
    """The family, variant and ``(path, state)`` of each mapped state of an optax state."""
    found: list[tuple[str, Any]] = []

    def walk(x: Any, path: str) -> None:
        if isinstance(x, optax.EmptyState):
            return
        if type(x) in _SLOTS:
            found.append((path, x))
            return
        if isinstance(x, (tuple, list)) and not is_namedtuple(x):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")
            return
        where = f" at {path}" if path else ""
        raise NotPortableError(
            f"the optax state {type_name(x)}{where} has no torch.optim counterpart; "
            "optax sgd, adam, adamw, rmsprop and adagrad states (with stateless transforms "
            "such as clipping) cross frameworks, the others resume under JAX only"
        )

    walk(opt_state, "")
    types = [type(s) for _, s in found]
    trace = types[-1:] == [optax.TraceState]
    core = types[:-1] if trace and len(types) > 1 else types
    if types in ([], [optax.TraceState]):
        return "sgd", {"momentum": bool(types)}, found
    if core == [optax.ScaleByAdamState] and not trace:
        return "adam", {}, found
    if core in ([optax.ScaleByRmsState], [optax.ScaleByRStdDevState]):
        centered = core == [optax.ScaleByRStdDevState]
        return "rmsprop", {"centered": centered, "momentum": trace}, found
    if core == [optax.ScaleByRssState] and not trace:
        return "adagrad", {}, found
    raise NotPortableError(
        f"the optax state with {[t.__qualname__ for t in types]} has no torch.optim counterpart"
    )


def neutral_view(module: JaxModule, opt_state: Any) -> OptimizerState:
    """The neutral view of an optax state, its slots naming `export_native`'s tensors.

    Raises:
        NotPortableError: the state has no neutral form (the message says why).
    """
    family, variant, found = _classify(opt_state)
    slots: dict[str, dict[str, Any]] = {slot: {} for slot in FAMILIES[family]}
    step = 0
    for path, state in found:
        for field, slot in _SLOTS[type(state)].items():
            values = getattr(state, field)
            if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
                raise NotPortableError(
                    f"the optax {type_name(state)}.{field} at {path} is not a dict by "
                    "parameter name (a state over module.params)"
                )
            slots[slot] = {k: f"optimizer{path}.{field}[{k!r}]" for k in values}
        if isinstance(state, optax.ScaleByAdamState):
            step = int(state.count)
    return OptimizerState(family, step, slots, {}, variant, lr_folded=family == "rmsprop")


def check_neutral(
    module: JaxModule, opt_state: Any, state: OptimizerState, loaded: set[str]
) -> Callable[[], Any]:
    """Validates neutral `state` against the optax state given; returns its filler.

    The filler gives the filled state; parameters not in `loaded` keep the given values.
    """
    family, variant, _ = _classify(opt_state)
    given = "the optax state given"
    state.check_fits(family, variant, takes=f"{given} is {family}", has=f"{given} has")

    def fill(path: str, template: dict[str, Any], slot: str) -> dict[str, Any]:
        out = dict(template)
        stored = state.slots.get(slot, {})
        for k in template:  # loaded, none stored: a fresh optimizer's zeros, not stale ones
            if k in loaded and k not in stored:
                out[k] = jnp.zeros_like(template[k])
        for k, value in stored.items():
            if k not in template or k not in loaded:
                continue
            array = np.asarray(value)
            if array.shape != tuple(template[k].shape):
                raise CheckpointError(
                    f"optimizer slot {slot} of {k} is {array.shape} on disk but "
                    f"{tuple(template[k].shape)} in the optax state given ({path})"
                )
            if slot == "momentum_buffer" and family == "rmsprop" and not state.lr_folded:
                if k not in state.lrs:
                    raise CheckpointError(f"RMSprop's learning rate for {k} was not recorded")
                array = array * -state.lrs[k]  # optax keeps this buffer times -lr
            out[k] = jnp.asarray(array, dtype=template[k].dtype)
        return out

    def replace(node: Any) -> Any:
        slots = _SLOTS.get(type(node))
        if slots is None:
            return node
        fields: dict[str, Any] = {
            f: fill(type(node).__qualname__, getattr(node, f), s) for f, s in slots.items()
        }
        if isinstance(node, optax.ScaleByAdamState):
            fields["count"] = jnp.asarray(state.step, dtype=node.count.dtype)
        return node._replace(**fields)

    filled = jax.tree_util.tree_map(
        replace, opt_state, is_leaf=lambda x: type(x) in _SLOTS or isinstance(x, optax.EmptyState)
    )
    return lambda: filled
