"""TimeMachine's JAX half: a JaxModule's arrays and optax state, in neutral form."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import safetensors

from dualtrain.aerolog.optim_state import OptimizerState
from dualtrain.aerolog.time_machine import CheckpointError
from dualtrain_jax.craft import JaxModule

__all__ = [
    "export_optimizer",
    "export_tensors",
    "import_optimizer",
    "import_tensors",
    "read",
    "shapes",
]

_STATES = (optax.ScaleByAdamState, optax.TraceState)


def export_tensors(module: JaxModule) -> dict[str, np.ndarray]:
    """Parameters and state by neutral name (JAX keeps the canonical layout) on the host."""
    return {name: np.asarray(value) for name, value in {**module.params, **module.state}.items()}


def shapes(module: JaxModule) -> dict[str, tuple[int, ...]]:
    """Shapes of what `export_tensors` would give."""
    return {name: tuple(v.shape) for name, v in {**module.params, **module.state}.items()}


def read(path: Any, names: list[str]) -> dict[str, np.ndarray]:
    """Arrays `names` of an anchor, read by safetensors into host memory."""
    with safetensors.safe_open(str(path), framework="numpy") as f:
        return {name: f.get_tensor(name) for name in names}


def import_tensors(module: JaxModule, tensors: dict[str, np.ndarray]) -> None:
    """Replaces the module's arrays with `tensors` (cast to each array's dtype)."""

    def merged(current: dict[str, Any]) -> dict[str, Any]:
        return {
            name: jnp.asarray(tensors[name], dtype=value.dtype) if name in tensors else value
            for name, value in current.items()
        }

    module.params, module.state = merged(module.params), merged(module.state)


def _found(opt_state: Any) -> list[Any]:
    leaves = jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, _STATES))
    return [leaf for leaf in leaves if isinstance(leaf, _STATES)]


def export_optimizer(module: JaxModule, opt_state: Any) -> OptimizerState:
    """The state of optax sgd (with or without momentum), adam or adamw in neutral form."""
    found = _found(opt_state)
    hyper = dict(getattr(opt_state, "hyperparams", {}) or {})
    hyper = {k: float(np.asarray(v)) for k, v in hyper.items()}
    if any(isinstance(s, optax.ScaleByAdamState) for s in found):
        adam = next(s for s in found if isinstance(s, optax.ScaleByAdamState))
        slots = {
            "exp_avg": {k: np.asarray(v) for k, v in adam.mu.items()},
            "exp_avg_sq": {k: np.asarray(v) for k, v in adam.nu.items()},
        }
        return OptimizerState("adam", int(adam.count), slots, hyper)
    trace = next((s for s in found if isinstance(s, optax.TraceState)), None)
    momentum = {} if trace is None else {k: np.asarray(v) for k, v in trace.trace.items()}
    return OptimizerState("sgd", 0, {"momentum": momentum}, hyper)


def import_optimizer(module: JaxModule, opt_state: Any, state: OptimizerState) -> Any:
    """A copy of `opt_state` (from the optax optimizer you resume with) filled from `state`."""
    families = {
        "adam" if isinstance(s, optax.ScaleByAdamState) else "sgd" for s in _found(opt_state)
    }
    if (families and state.family not in families) or (not families and state.family == "adam"):
        raise CheckpointError(
            f"the checkpoint holds {state.family} state; this optax state has {sorted(families)}"
        )

    def fill(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
        return {
            k: jnp.asarray(values[k], dtype=v.dtype) if k in values else v
            for k, v in template.items()
        }

    def replace(node: Any) -> Any:
        if isinstance(node, optax.ScaleByAdamState):
            return node._replace(
                count=jnp.asarray(state.step, dtype=node.count.dtype),
                mu=fill(node.mu, state.slots["exp_avg"]),
                nu=fill(node.nu, state.slots["exp_avg_sq"]),
            )
        if isinstance(node, optax.TraceState):
            return node._replace(trace=fill(node.trace, state.slots["momentum"]))
        return node

    return jax.tree_util.tree_map(replace, opt_state, is_leaf=lambda x: isinstance(x, _STATES))


def export_rng() -> None:
    """JAX has no global generator: keys are values the caller holds."""
    return None


def import_rng(state: np.ndarray) -> None:
    """Nothing to restore: JAX keys are explicit."""
