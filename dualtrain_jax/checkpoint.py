"""TimeMachine's JAX half: a JaxModule's arrays and optax state, in neutral form.

optax keeps a schedule inside the optimizer state, so there is no LR scheduler to store:
`check_scheduler_support` refuses one.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from dualtrain.errors import ArgumentError, CheckpointError, bad_argument
from dualtrain_jax.craft import JaxModule
from dualtrain_jax.optimizer_state import (  # optimizer state: TimeMachine reaches it here
    check_native,
    check_neutral,
    export_native,
    export_optimizer,
    import_optimizer,
    neutral_view,
)

__all__ = [
    "check_native",
    "check_optimizer_argument",
    "check_neutral",
    "check_scheduler_support",
    "export_native",
    "export_optimizer",
    "export_rng",
    "export_tensors",
    "import_optimizer",
    "import_rng",
    "import_tensors",
    "native",
    "neutral_view",
    "shapes",
    "specs",
]


def check_optimizer_argument(optimizer: Any) -> None:
    """Refuses, before any file is read, an `optimizer` that cannot be an optax state."""
    if optimizer is None:
        return
    import optax

    if isinstance(optimizer, optax.GradientTransformation):
        raise ArgumentError(
            "optimizer must be an optax state: pass tx.init(params) (of the optimizer you "
            f"resume with), not the transformation; got optimizer={type(optimizer).__name__}"
        )
    if hasattr(optimizer, "param_groups") or type(optimizer).__module__.startswith("torch"):
        raise ArgumentError(
            "optimizer must be an optax state for a JAX module (tx.init(module.params)); got "
            f"a torch optimizer, optimizer={type(optimizer).__name__}"
        )


def export_tensors(module: JaxModule) -> dict[str, np.ndarray]:
    """Parameters and state by neutral name (JAX keeps the canonical layout) on the host."""
    return {name: np.asarray(value) for name, value in {**module.params, **module.state}.items()}


def shapes(module: JaxModule) -> dict[str, tuple[int, ...]]:
    """Shapes of what `export_tensors` would give."""
    return {name: tuple(v.shape) for name, v in {**module.params, **module.state}.items()}


def specs(module: JaxModule) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of what `export_tensors` would give.

    JAX's BatchNorm keeps no ``num_batches_tracked`` (torch's bookkeeping): a torch anchor's
    count is not loaded here, and a JAX anchor loaded into torch leaves torch's count as is.
    """
    return {
        name: (tuple(v.shape), np.dtype(v.dtype))
        for name, v in {**module.params, **module.state}.items()
    }


def native(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checked host arrays of an anchor: JAX takes NumPy arrays as they are."""
    return arrays


def import_tensors(module: JaxModule, tensors: dict[str, np.ndarray]) -> None:
    """Replaces the module's arrays with `tensors` (cast to each array's dtype).

    Every name and shape is checked before any array is replaced; a shape is never
    broadcast (``(1,)`` does not fill ``(16,)``).
    """
    current = {**module.params, **module.state}
    for name, value in tensors.items():
        if name not in current:
            raise CheckpointError(f"{name} is not an array of this module")
        if tuple(np.shape(value)) != tuple(current[name].shape):
            raise CheckpointError(
                f"{name} is {tuple(np.shape(value))} in the checkpoint but "
                f"{tuple(current[name].shape)} in the model"
            )

    def merged(current: dict[str, Any]) -> dict[str, Any]:
        return {
            name: jnp.asarray(tensors[name], dtype=value.dtype) if name in tensors else value
            for name, value in current.items()
        }

    module.params, module.state = merged(module.params), merged(module.state)


def export_rng() -> None:
    """JAX has no global generator: keys are values the caller holds."""
    return None


def import_rng(state: np.ndarray) -> None:
    """Nothing to restore: JAX keys are explicit."""


def check_scheduler_support(scheduler: Any, loading: bool) -> None:
    """Refuses an LR scheduler: optax keeps schedules inside the optimizer state."""
    if loading:
        raise CheckpointError("scheduler is torch's; under JAX the schedule is in the optax state")
    raise bad_argument(
        "scheduler",
        type(scheduler).__name__,
        "None under JAX (optax keeps schedules inside the optimizer state)",
    )
