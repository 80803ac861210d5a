"""torch.optim state in neutral form: the families that cross to optax, and their loading.

`neutral_view` maps SGD, Adam, AdamW, RMSprop and Adagrad onto
``dualtrain.checkpoint.optim_state``'s families (slots by torch's names, naming the native
tensors ``optimizer.<slot>.<name>``); `check_neutral` validates neutral state against a torch
optimizer and returns its all-or-nothing filler. The native form is
``dualtrain_torch.optimizer_state``'s; ``dualtrain_jax.optimizer_neutral`` is the JAX twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dualtrain import convert
from dualtrain.checkpoint.optim_state import FAMILIES, VARIANTS, NotPortableError, OptimizerState
from dualtrain.errors import ArgumentError, CheckpointError

__all__ = ["check_neutral", "neutral_view", "param_names", "require_optimizer"]

_CROSSING = {
    torch.optim.SGD: "sgd",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adam",
    torch.optim.RMSprop: "rmsprop",
    torch.optim.Adagrad: "adagrad",
}


def param_names(module: torch.nn.Module) -> dict[int, str]:
    """Each parameter's name by its object's id (how optimizer state finds its name)."""
    return {id(p): n for n, p in module.named_parameters()}


def require_optimizer(optimizer: Any) -> str:
    """The class name of `optimizer`, refused (ArgumentError) unless a torch optimizer."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ArgumentError(
            f"optimizer must be a torch.optim.Optimizer over the module's parameters; "
            f"got optimizer={type(optimizer).__name__}"
        )
    return type(optimizer).__name__


def _family(optimizer: torch.optim.Optimizer) -> tuple[str, dict[str, bool]]:
    """The neutral family and variant of `optimizer`, or NotPortableError saying why not."""
    cls = type(optimizer).__name__
    family = _CROSSING.get(type(optimizer))
    if family is None:
        raise NotPortableError(
            f"torch.optim.{cls} has no optax counterpart with the same state and update; "
            "SGD, Adam, AdamW, RMSprop and Adagrad cross frameworks, the others resume "
            "under torch only"
        )
    groups = optimizer.param_groups
    if any(g.get("maximize") for g in groups):
        raise NotPortableError(f"torch.optim.{cls} with maximize=True has no optax counterpart")
    if family == "sgd" and any(g.get("dampening") for g in groups):
        raise NotPortableError(f"torch.optim.{cls} with dampening != 0: optax's trace has none")
    if family == "adam" and any(g.get("amsgrad") for g in groups):
        raise NotPortableError(
            f"torch.optim.{cls} with amsgrad=True: torch keeps the maximum of the raw second "
            "moment, optax.amsgrad of the bias-corrected one"
        )
    if family == "adagrad" and any(g.get("lr_decay") for g in groups):
        raise NotPortableError(
            f"torch.optim.{cls} with lr_decay != 0: optax.adagrad has no lr decay"
        )
    variant = {}
    for flag in VARIANTS[family]:
        values = {bool(g.get(flag)) for g in groups}
        if len(values) > 1:
            raise NotPortableError(f"torch.optim.{cls}'s param_groups differ in {flag}")
        variant[flag] = values.pop()
    return family, variant


def neutral_view(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> OptimizerState:
    """The neutral view of `optimizer`, its slots naming `export_native`'s tensors.

    Raises:
        NotPortableError: the optimizer has no neutral form (the message says why).
    """
    family, variant = _family(optimizer)
    names = param_names(module)
    slots: dict[str, dict[str, Any]] = {slot: {} for slot in FAMILIES[family]}
    steps, lrs = set(), {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            name, state = names[id(p)], optimizer.state.get(p, {})
            for slot in FAMILIES[family]:
                if isinstance(state.get(slot), torch.Tensor):
                    slots[slot][name] = f"optimizer.{slot}.{name}"
            steps.add(int(state["step"]) if "step" in state else 0)
            lrs[name] = float(group["lr"])
    if family == "adam" and len(steps) > 1:
        raise NotPortableError(
            f"torch.optim.{type(optimizer).__name__}'s parameters have taken different numbers "
            f"of steps {sorted(steps)}; optax keeps one count"
        )
    hyper = {k: v for k, v in optimizer.param_groups[0].items() if _plain(v)}
    hyper["class"] = type(optimizer).__name__
    keep_lrs = family == "rmsprop" and variant["momentum"]
    return OptimizerState(
        family, max(steps, default=0), slots, hyper, variant, lrs if keep_lrs else {}
    )


def check_neutral(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: OptimizerState,
    loaded: set[str],
) -> Callable[[], torch.optim.Optimizer]:
    """Validates neutral `state` against `optimizer`; returns the function that loads it."""
    cls = require_optimizer(optimizer)
    family, variant = _family(optimizer)
    state.check_fits(
        family,
        variant,
        takes=f"torch.optim.{cls} takes {family} state",
        has=f"torch.optim.{cls} here has",
    )
    names = param_names(module)
    needed = {
        "sgd": ["momentum_buffer"] if variant.get("momentum") else [],
        "adam": ["exp_avg", "exp_avg_sq"],
        "rmsprop": ["square_avg"]
        + (["grad_avg"] if variant.get("centered") else [])
        + (["momentum_buffer"] if variant.get("momentum") else []),
        "adagrad": ["sum"],
    }[family]
    plan: list[tuple[torch.Tensor, dict[str, torch.Tensor] | None]] = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names.get(id(p))
            if name is None:
                raise CheckpointError(f"optimizer {cls} holds a parameter that is not the module's")
            if name not in loaded:
                continue  # a skipped parameter keeps its state
            if not any(name in state.slots[s] for s in needed):
                plan.append((p, None))  # none stored: none kept (a fresh optimizer's)
                continue
            values = {}
            for slot in needed:
                value = state.slots[slot].get(name)
                if value is None:
                    values[slot] = torch.zeros_like(p)
                    continue
                tensor = value if isinstance(value, torch.Tensor) else convert(value, to="torch")
                if tuple(tensor.shape) != tuple(p.shape):
                    raise CheckpointError(
                        f"optimizer slot {slot} of {name} is {tuple(tensor.shape)} on disk but "
                        f"{tuple(p.shape)} in the model"
                    )
                if slot == "momentum_buffer" and family == "rmsprop" and state.lr_folded:
                    lr = float(group["lr"])
                    if lr == 0:
                        raise CheckpointError(
                            "optax keeps RMSprop's momentum multiplied by -lr; with lr=0 "
                            "torch's buffer cannot be recovered"
                        )
                    tensor = tensor / -lr
                values[slot] = torch.empty_like(p).copy_(tensor)
            if family != "sgd":
                values["step"] = torch.tensor(float(state.step), dtype=_scalar_dtype())
            plan.append((p, values))

    missing = object()
    old = [(p, optimizer.state.get(p, missing)) for p, _ in plan]

    def undo() -> None:
        for p, values in old:
            if values is missing:
                optimizer.state.pop(p, None)
            else:
                optimizer.state[p] = values

    def apply() -> torch.optim.Optimizer:
        for p, values in plan:
            if values is None:
                optimizer.state.pop(p, None)
            else:
                optimizer.state[p] = values
        return optimizer

    apply.undo = undo  # type: ignore[attr-defined]
    return apply


def _scalar_dtype() -> torch.dtype:
    # torch.optim keeps `step` as a float32 tensor, float64 under a float64 default dtype.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _plain(value: Any) -> bool:
    return isinstance(value, (int, float, bool, str, type(None))) or (
        isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value)
    )
