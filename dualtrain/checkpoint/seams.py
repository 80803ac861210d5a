"""What TimeMachine asks of an adapter's ``checkpoint`` module: tensors, RNG, optimizer state.

A module's members play the Protocol's methods. `part_of` finds a realized module's part
and `checkpoint_part(name)` a backend's, typed as `CheckpointPart`
(`torch_checkpoint_part()`: `TorchCheckpointPart`, which also stores LR schedulers), and
``tests/test_seams.py`` checks both adapters against these signatures. What differs between
frameworks is the adapter's to say (`check_scheduler_support`: JAX keeps no LR scheduler,
optax keeps the schedule in its state), so the core never asks which framework it runs on.
Parameters before a ``/`` are passed by position and named as each framework likes
(``optimizer`` for torch, ``opt_state`` for optax).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from dualtrain import backends
from dualtrain.checkpoint.vocabulary import BACKENDS
from dualtrain.errors import bad_argument

if TYPE_CHECKING:
    import numpy as np

    from dualtrain.checkpoint.optim_state import OptimizerState

__all__ = [
    "CheckpointPart",
    "TorchCheckpointPart",
    "checkpoint_part",
    "part_of",
    "torch_checkpoint_part",
]


class CheckpointPart(Protocol):
    """``dualtrain_<name>.checkpoint``, used by `dualtrain.checkpoint.time_machine`.

    `module` is a realized Craft module of the adapter's framework; `optimizer` its
    optimizer (torch) or optimizer state (optax); names are neutral (canonical) names.
    """

    def check_optimizer_argument(self, optimizer: Any) -> None:
        """Refuses, before any file is read, an optimizer of the wrong kind."""
        ...

    def specs(self, module: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and NumPy dtype by name of what `export_tensors` would give, no copy."""
        ...

    def native(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        """Checked host arrays as the framework's arrays, without a copy where it can."""
        ...

    def export_tensors(self, module: Any) -> dict[str, np.ndarray]:
        """Parameters and state by name, in the canonical layout, as host arrays."""
        ...

    def import_tensors(self, module: Any, tensors: dict[str, np.ndarray]) -> None:
        """Writes canonical arrays into `module` (cast to each one's dtype)."""
        ...

    def export_rng(self) -> np.ndarray | None:
        """The framework's global generator state, or None when it has none (JAX)."""
        ...

    def import_rng(self, state: Any) -> None:
        """Restores what `export_rng` gave."""
        ...

    def export_native(
        self, module: Any, optimizer: Any, /, keep: Callable[[str], bool]
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The optimizer state of the parameters `keep` accepts: (manifest entry, tensors)."""
        ...

    def neutral_view(self, module: Any, optimizer: Any, /) -> OptimizerState:
        """The optimizer state in the portable form; raises NotPortableError if none."""
        ...

    def check_native(
        self,
        module: Any,
        optimizer: Any,
        /,
        entry: dict[str, Any],
        tensors: dict[str, Any],
        loaded: set[str],
    ) -> Callable[[], Any]:
        """Validates a native entry against `optimizer`; returns the function that loads it."""
        ...

    def check_neutral(
        self, module: Any, optimizer: Any, /, state: OptimizerState, loaded: set[str]
    ) -> Callable[[], Any]:
        """Validates a portable state against `optimizer`; returns the function loading it."""
        ...

    def check_scheduler_support(self, scheduler: Any, /, loading: bool) -> None:
        """Refuses `scheduler` where the framework stores none (`loading`: at `to`, not `drop`).

        Where it returns, the part is a `TorchCheckpointPart`, which stores it.
        """
        ...


class TorchCheckpointPart(CheckpointPart, Protocol):
    """``dualtrain_torch.checkpoint``: also LR schedulers (optax keeps schedules in its state)."""

    def export_scheduler(self, scheduler: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """An LR scheduler's state: (manifest entry, tensors)."""
        ...

    def check_scheduler(
        self, scheduler: Any, entry: dict[str, Any], tensors: dict[str, Any]
    ) -> Callable[[], Any]:
        """Validates a scheduler entry against `scheduler`; returns the function loading it."""
        ...


def part_of(craft: Any) -> CheckpointPart:
    """The checkpoint part of the adapter that realized `craft` (ArgumentError for others)."""
    name = getattr(craft, "dualtrain_backend", None)
    if name not in BACKENDS:
        raise bad_argument(
            "craft",
            type(craft).__name__,
            "a module from dualtrain_torch.realize or dualtrain_jax.realize",
        )
    return checkpoint_part(name)


def checkpoint_part(name: str) -> CheckpointPart:
    """Backend `name`'s ``checkpoint`` module (loads its framework)."""
    return backends.load_part(name, "checkpoint")


def torch_checkpoint_part() -> TorchCheckpointPart:
    """The torch adapter's ``checkpoint`` module, LR schedulers included (loads torch)."""
    return backends.load_part("torch", "checkpoint")
