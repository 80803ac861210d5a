"""TimeMachine's torch half: a CraftModule's tensors and torch.optim state, in neutral form."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dualtrain import convert
from dualtrain.checkpoint.fit import BOOKKEEPING
from dualtrain.errors import ArgumentError
from dualtrain_torch.craft import CraftModule, load_canonical
from dualtrain_torch.optimizer_state import (  # optimizer and scheduler state: reached here
    check_native,
    check_neutral,
    check_scheduler,
    export_native,
    export_optimizer,
    export_scheduler,
    import_optimizer,
    neutral_view,
)

__all__ = [
    "check_native",
    "check_optimizer_argument",
    "check_neutral",
    "check_scheduler",
    "check_scheduler_support",
    "export_native",
    "export_optimizer",
    "export_rng",
    "export_scheduler",
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
    """Refuses, before any file is read, an `optimizer` that is not a torch optimizer."""
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        what = "an optax state" if type(optimizer).__module__.startswith("optax") else "a"
        raise ArgumentError(
            "optimizer must be a torch.optim.Optimizer over the module's parameters for a "
            f"torch module; got {what} {type(optimizer).__name__}"
        )


def check_scheduler_support(scheduler: Any, loading: bool) -> None:
    """Nothing to refuse: torch's LR schedulers are stored (`export_scheduler`)."""


def _saved_names(module: CraftModule) -> set[str]:
    """Neutral names (a tied layer's first place only) plus native modules' own names.

    Also torch's bookkeeping buffers (BatchNorm's ``num_batches_tracked``).
    """
    names = set(module.craft.param_specs())
    natives = [name + "." for name, _ in module.craft.natives()]
    for key in module.state_dict():
        if (natives and key.startswith(tuple(natives))) or key.rpartition(".")[2] in BOOKKEEPING:
            names.add(key)
    return names


def _host(tensor: torch.Tensor) -> np.ndarray:
    """A host NumPy view of `tensor` (bfloat16 as ml_dtypes', which safetensors stores as BF16)."""
    return convert(tensor.detach().cpu(), to="numpy")


def shapes(module: CraftModule) -> dict[str, tuple[int, ...]]:
    """Canonical shapes of what `export_tensors` would give, without copying anything."""
    wanted = _saved_names(module)
    return {name: tuple(t.shape) for name, t in module.state_dict().items() if name in wanted}


def specs(module: CraftModule) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Canonical shape and (NumPy) dtype of what `export_tensors` would give, no copy."""
    wanted = _saved_names(module)
    dtypes: dict[torch.dtype, np.dtype] = {}
    out = {}
    for name, t in module.state_dict().items():
        if name in wanted:
            if t.dtype not in dtypes:
                dtypes[t.dtype] = _host(torch.empty(0, dtype=t.dtype)).dtype
            out[name] = (tuple(t.shape), dtypes[t.dtype])
    return out


def native(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Checked host arrays of an anchor (over its private mapping) as torch tensors, no copy."""
    return {name: convert(a, to="torch") for name, a in arrays.items()}


def export_tensors(module: CraftModule) -> dict[str, np.ndarray]:
    """Parameters and state by neutral name, canonical layout, as host NumPy arrays."""
    wanted = _saved_names(module)
    return {name: _host(t) for name, t in module.state_dict().items() if name in wanted}


def import_tensors(module: CraftModule, tensors: dict[str, np.ndarray]) -> None:
    """Copies canonical arrays into the module in place (cast to each parameter's dtype)."""
    load_canonical(module, tensors)


def export_rng() -> np.ndarray:
    """The state of torch's global CPU generator, as bytes."""
    return torch.random.get_rng_state().numpy()


def import_rng(state: Any) -> None:
    """Restores torch's global CPU generator."""
    torch.random.set_rng_state(_tensor(state).to(torch.uint8).contiguous())


def _tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value))
