"""TimeMachine's torch half: a CraftModule's tensors and torch.optim state, in neutral form."""

from __future__ import annotations

from typing import Any

import numpy as np
import safetensors
import torch

from dualtrain import convert
from dualtrain.aerolog.optim_state import OptimizerState
from dualtrain.aerolog.time_machine import CheckpointError
from dualtrain_torch.craft import CraftModule, load_canonical

__all__ = [
    "export_optimizer",
    "export_tensors",
    "import_optimizer",
    "import_tensors",
    "read",
    "shapes",
]

_FAMILY = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adam"}
_SLOTS = {
    "sgd": {"momentum": "momentum_buffer"},
    "adam": {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"},
}


def _saved_names(module: CraftModule) -> set[str]:
    """Neutral names (a tied layer's first place only) plus native modules' own names."""
    names = set(module.craft.param_specs())
    natives = [name + "." for name, _ in module.craft.natives()]
    names.update(k for k in module.state_dict() if k.startswith(tuple(natives)) and natives)
    return names


def _host(tensor: torch.Tensor) -> np.ndarray:
    """A host NumPy view of `tensor` (bfloat16 as ml_dtypes', which safetensors stores as BF16)."""
    return convert(tensor.detach().cpu(), to="numpy")


def shapes(module: CraftModule) -> dict[str, tuple[int, ...]]:
    """Canonical shapes of what `export_tensors` would give, without copying anything."""
    wanted = _saved_names(module)
    return {name: tuple(t.shape) for name, t in module.state_dict().items() if name in wanted}


def read(path: Any, names: list[str]) -> dict[str, torch.Tensor]:
    """Tensors `names` of an anchor, memory-mapped by safetensors (no copy until used)."""
    with safetensors.safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) for name in names}


def export_tensors(module: CraftModule) -> dict[str, np.ndarray]:
    """Parameters and state by neutral name, canonical layout, as host NumPy arrays."""
    wanted = _saved_names(module)
    return {name: _host(t) for name, t in module.state_dict().items() if name in wanted}


def import_tensors(module: CraftModule, tensors: dict[str, np.ndarray]) -> None:
    """Copies canonical arrays into the module in place (cast to each parameter's dtype)."""
    load_canonical(module, tensors)


def _family(optimizer: Any) -> str:
    family = _FAMILY.get(type(optimizer))
    if family is None:
        raise TypeError(
            f"optimizer must be torch.optim.SGD, Adam or AdamW to cross frameworks; "
            f"got {type(optimizer).__name__}"
        )
    if family == "adam" and any(g.get("amsgrad") for g in optimizer.param_groups):
        raise TypeError("Adam with amsgrad=True has no optax equivalent to cross to")
    return family


def export_optimizer(module: CraftModule, optimizer: torch.optim.Optimizer) -> OptimizerState:
    """The optimizer's state in neutral form, keyed by the module's parameter names."""
    family = _family(optimizer)
    names = {id(p): n for n, p in module.named_parameters()}
    slots: dict[str, dict[str, Any]] = {slot: {} for slot in _SLOTS[family]}
    step = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if id(p) not in names:
                raise CheckpointError("the optimizer holds a parameter that is not the module's")
            for slot, key in _SLOTS[family].items():
                if state.get(key) is not None:
                    slots[slot][names[id(p)]] = _host(state[key])
            if "step" in state:
                step = max(step, int(state["step"]))
    hyper = {k: v for k, v in optimizer.param_groups[0].items() if k != "params" and _plain(v)}
    hyper["class"] = type(optimizer).__name__
    return OptimizerState(family, step, slots, hyper)


def import_optimizer(
    module: CraftModule, optimizer: torch.optim.Optimizer, state: OptimizerState
) -> torch.optim.Optimizer:
    """Fills `optimizer`'s per-parameter state from `state`; returns the optimizer."""
    family = _family(optimizer)
    if family != state.family:
        raise CheckpointError(
            f"the checkpoint holds {state.family} state; "
            f"a {type(optimizer).__name__} cannot take it"
        )
    for name, p in module.named_parameters():
        values = {}
        for slot, key in _SLOTS[family].items():
            if name in state.slots[slot]:
                values[key] = torch.empty_like(p).copy_(_tensor(state.slots[slot][name]))
        if values:
            if family == "adam":
                values["step"] = torch.tensor(float(state.step), dtype=torch.float32)
            optimizer.state[p] = values
    return optimizer


def export_rng() -> np.ndarray:
    """The state of torch's global CPU generator, as bytes."""
    return torch.random.get_rng_state().numpy()


def import_rng(state: Any) -> None:
    """Restores torch's global CPU generator."""
    torch.random.set_rng_state(_tensor(state).to(torch.uint8).contiguous())


def _tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value))


def _plain(value: Any) -> bool:
    return isinstance(value, (int, float, bool, str, type(None))) or (
        isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value)
    )
