"""torch.optim state in an anchor: any optimizer natively, five of them across frameworks.

Native form: the optimizer's ``state_dict()`` keyed by parameter name (not index, so it
survives a reordering), tensors to the file as ``optimizer.<key>.<name>`` and everything else
(param_groups' hyper-parameters, scalars, lists) to the manifest's JSON. LR schedulers are in
``dualtrain_torch.scheduler_state``, whose state-dict encoding this module shares. The neutral
view (`neutral_view`) maps SGD, Adam, AdamW, RMSprop and Adagrad onto
``dualtrain.checkpoint.optim_state``'s families.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dualtrain import convert
from dualtrain.checkpoint.optim_state import FAMILIES, VARIANTS, NotPortableError, OptimizerState
from dualtrain.errors import ArgumentError, CheckpointError
from dualtrain_torch.scheduler_state import _decode, _Encoder, _UnstorableError

__all__ = [
    "check_native",
    "check_neutral",
    "export_native",
    "export_optimizer",
    "import_optimizer",
    "neutral_view",
]

_CROSSING = {
    torch.optim.SGD: "sgd",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adam",
    torch.optim.RMSprop: "rmsprop",
    torch.optim.Adagrad: "adagrad",
}


def _names(module: torch.nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in module.named_parameters()}


def _require(optimizer: Any) -> str:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ArgumentError(
            f"optimizer must be a torch.optim.Optimizer over the module's parameters; "
            f"got optimizer={type(optimizer).__name__}"
        )
    return type(optimizer).__name__


def _refused(cls: str, why: str) -> ArgumentError:
    return ArgumentError(
        f"optimizer {cls} cannot be stored without pickle: {why}; a state dict must hold "
        "only tensors, numbers, strings, None, tuples, lists and dicts with str keys"
    )


# ---- native ------------------------------------------------------------------------------


def export_native(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, keep: Callable[[str], bool]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The optimizer's state dict by parameter name: (manifest entry, tensors).

    Only parameters for which `keep` is true keep their state; param_groups are whole.

    Raises:
        ArgumentError: naming the optimizer, if a value has no tensor-or-JSON form or a
            parameter is not the module's.
    """
    cls = _require(optimizer)
    names = _names(module)
    state_dict = optimizer.state_dict()
    index_name: dict[int, str] = {}
    for saved, group in zip(state_dict["param_groups"], optimizer.param_groups, strict=True):
        for index, p in zip(saved["params"], group["params"], strict=True):
            if id(p) not in names:
                raise ArgumentError(
                    f"optimizer {cls} holds a parameter of shape {tuple(p.shape)} that is "
                    "not the module's; give drop the module it optimizes"
                )
            index_name[index] = names[id(p)]
    if isinstance(optimizer, torch.optim.LBFGS) and not all(map(keep, index_name.values())):
        raise ArgumentError(
            "optimizer LBFGS keeps one state over all its parameters; save_scope would cut it"
        )
    encoder = _Encoder()
    try:
        groups = [
            {
                "params": [index_name[i] for i in saved["params"]],
                "hyper": encoder.encode(
                    {k: v for k, v in saved.items() if k != "params"},
                    f"optimizer.param_groups[{g}]",
                    f"param_groups[{g}]",
                ),
            }
            for g, saved in enumerate(state_dict["param_groups"])
        ]
        state = {}
        for index, values in state_dict["state"].items():
            name = index_name[index]
            if keep(name):
                state[name] = {
                    key: encoder.encode(value, f"optimizer.{key}.{name}", f"state[{name!r}]", name)
                    for key, value in values.items()
                }
    except _UnstorableError as why:
        raise _refused(cls, str(why)) from None
    entry = {
        "class": cls,
        "module": type(optimizer).__module__,
        "param_groups": groups,
        "state": state,
        "tensors": encoder.info,
    }
    return entry, encoder.tensors


def check_native(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    entry: dict[str, Any],
    tensors: dict[str, Any],
    loaded: set[str],
) -> Callable[[], torch.optim.Optimizer]:
    """Validates a native entry against `optimizer`; returns the function that loads it.

    Parameters are matched by name. A parameter not in `loaded` (skipped by `to`) keeps the
    state it has; param_groups' hyper-parameters are restored.
    """
    cls = _require(optimizer)
    if cls != entry.get("class"):
        raise CheckpointError(
            f"it holds torch.optim.{entry.get('class')} state; the optimizer given is "
            f"torch.optim.{cls} (resume with the optimizer class that wrote it)"
        )
    names = _names(module)
    current = optimizer.state_dict()
    stored_groups = entry.get("param_groups", [])
    home = {name: g for g, group in enumerate(stored_groups) for name in group["params"]}
    name_index: dict[str, int] = {}
    new_groups = []
    for g, (saved, group) in enumerate(
        zip(current["param_groups"], optimizer.param_groups, strict=True)
    ):
        group_names = []
        for index, p in zip(saved["params"], group["params"], strict=True):
            if id(p) not in names:
                raise CheckpointError(
                    f"optimizer {cls} holds a parameter of shape {tuple(p.shape)} that is not "
                    "the module's"
                )
            name_index[names[id(p)]] = index
            group_names.append(names[id(p)])
        homes = sorted({home[n] for n in group_names if n in home})
        if len(homes) > 1:
            raise CheckpointError(
                f"param_groups[{g}] of the {cls} given mixes parameters of the anchor's "
                f"param_groups {homes}"
            )
        new = dict(saved)
        if homes:
            new.update(_decode(stored_groups[homes[0]]["hyper"], tensors))
        new["params"] = saved["params"]
        if "param_names" in saved:
            new["param_names"] = saved["param_names"]
        if isinstance(optimizer, torch.optim.LBFGS):
            stored_names = stored_groups[0]["params"] if stored_groups else []
            if group_names != stored_names or not set(group_names) <= loaded:
                raise CheckpointError(
                    "LBFGS keeps one state over all its parameters, in order; the anchor's "
                    f"parameters {stored_names} and the loaded ones {sorted(loaded)} differ "
                    f"from the optimizer's {group_names}"
                )
        new_groups.append(new)
    stored_state = entry.get("state", {})
    if not isinstance(stored_state, dict):
        raise CheckpointError(f"malformed optimizer entry: 'state' is {type(stored_state)}")
    # Parameters not loaded keep what they have; loaded ones get exactly what is stored,
    # no state where none was stored (a rollback to a fresh optimizer drops the moments).
    index_name = {i: n for n, i in name_index.items()}
    new_state = {i: v for i, v in current["state"].items() if index_name.get(i) not in loaded}
    for name, values in stored_state.items():
        if name in loaded and name in name_index:
            if not isinstance(values, dict):
                raise CheckpointError(f"malformed optimizer entry: state of {name} is {values!r}")
            new_state[name_index[name]] = {k: _decode(v, tensors) for k, v in values.items()}
    new_dict = {"state": new_state, "param_groups": new_groups}
    return _all_or_nothing(optimizer, new_dict)


def _all_or_nothing(
    optimizer: torch.optim.Optimizer, new_dict: dict[str, Any]
) -> Callable[[], torch.optim.Optimizer]:
    """`optimizer.load_state_dict(new_dict)` as a filler that leaves it whole if it fails.

    ``load_state_dict`` builds new ``state`` and ``param_groups`` objects and sets them last,
    so the old ones, kept here, are the optimizer as it was (no copy of its tensors).
    """
    old = {"state": optimizer.state, "param_groups": optimizer.param_groups}

    def undo() -> None:
        optimizer.__setstate__(dict(old))

    def apply() -> torch.optim.Optimizer:
        try:
            optimizer.load_state_dict(new_dict)
        except Exception as err:
            undo()
            raise CheckpointError(
                f"its {type(optimizer).__name__} state does not load: {err!r}"
            ) from err
        return optimizer

    apply.undo = undo  # type: ignore[attr-defined]
    return apply


# ---- neutral -----------------------------------------------------------------------------


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
    names = _names(module)
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


def export_optimizer(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> OptimizerState:
    """The optimizer's state in neutral form (arrays), keyed by the module's parameter names.

    Raises:
        NotPortableError: the optimizer has no neutral form.
    """
    _require(optimizer)
    view = neutral_view(module, optimizer)
    params = dict(module.named_parameters())
    view.slots = {
        slot: {
            name: convert(optimizer.state[params[name]][slot].detach().cpu(), to="numpy")
            for name in values
        }
        for slot, values in view.slots.items()
    }
    return view


def check_neutral(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: OptimizerState,
    loaded: set[str],
) -> Callable[[], torch.optim.Optimizer]:
    """Validates neutral `state` against `optimizer`; returns the function that loads it."""
    cls = _require(optimizer)
    family, variant = _family(optimizer)
    if family != state.family:
        raise CheckpointError(
            f"it holds {state.name_of()} optimizer state; torch.optim.{cls} takes {family} state"
        )
    for flag, value in state.variant.items():
        if flag in variant and variant[flag] != value:
            raise CheckpointError(
                f"it holds {state.name_of()} optimizer state; torch.optim.{cls} here has "
                f"{flag}={variant[flag]}"
            )
    names = _names(module)
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


def import_optimizer(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: OptimizerState
) -> torch.optim.Optimizer:
    """Fills `optimizer`'s per-parameter state from neutral `state`; returns the optimizer."""
    loaded = {name for name, _ in module.named_parameters()}
    return check_neutral(module, optimizer, state, loaded)()


def _scalar_dtype() -> torch.dtype:
    # torch.optim keeps `step` as a float32 tensor, float64 under a float64 default dtype.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _plain(value: Any) -> bool:
    return isinstance(value, (int, float, bool, str, type(None))) or (
        isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value)
    )
