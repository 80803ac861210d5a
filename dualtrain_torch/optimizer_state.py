"""torch.optim and torch.optim.lr_scheduler state in an anchor.

Any optimizer is stored natively, five of them also across frameworks.

Native form: the optimizer's ``state_dict()`` keyed by parameter name (not index, so it
survives a reordering), tensors to the file as ``optimizer.<key>.<name>`` and everything else
(param_groups' hyper-parameters, scalars, lists) to the manifest's JSON. A scheduler's
``state_dict()`` goes the same way (tensors as ``scheduler...``): `_Encoder` and `_decode`
turn a state dict into tensors plus JSON and back, without pickle. The neutral view
(`neutral_view`, in ``dualtrain_torch.optimizer_neutral``) maps SGD, Adam, AdamW, RMSprop and
Adagrad onto ``dualtrain.checkpoint.optim_state``'s families. (optax keeps its schedules
inside the optimizer state, so JAX's ``optimizer_state`` has no scheduler half.)
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dualtrain import convert, dtypes
from dualtrain.checkpoint.optim_state import OptimizerState
from dualtrain.errors import ArgumentError, CheckpointError
from dualtrain_torch.optimizer_neutral import (
    check_neutral,
    neutral_view,
    param_names,
    require_optimizer,
)

__all__ = [
    "check_native",
    "check_neutral",
    "check_scheduler",
    "export_native",
    "export_optimizer",
    "export_scheduler",
    "import_optimizer",
    "neutral_view",
]

# What safetensors stores (and every framework has); anything else in a state dict is
# refused at drop.
_STORABLE = {getattr(torch, name) for name in dtypes.STORED_NAMES}


_MAPPINGS = (dict, collections.Counter, collections.OrderedDict)
_MAPPINGS_BY_NAME = {kind.__name__: kind for kind in _MAPPINGS}


class _UnstorableError(Exception):
    """A value of a state dict that has no tensor-or-JSON form (`where` says which)."""


class _Encoder:
    """Turns a state dict's values into JSON, moving tensors out to `tensors`."""

    def __init__(self) -> None:
        self.tensors: dict[str, np.ndarray] = {}
        self.info: dict[str, dict[str, Any]] = {}

    def encode(self, value: Any, tname: str, where: str, param: str | None = None) -> Any:
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided or value.dtype not in _STORABLE:
                raise _UnstorableError(f"{where} is a {value.dtype} {value.layout} tensor")
            if tname in self.tensors:
                raise _UnstorableError(f"{where} would be stored as {tname}, a name already taken")
            self.tensors[tname] = convert(value.detach().cpu(), to="numpy")
            self.info[tname] = {
                "shape": list(value.shape),
                "dtype": str(value.dtype).removeprefix("torch."),
                "param": param,
            }
            return {"tensor": tname}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (tuple, list)):
            items = [
                self.encode(v, f"{tname}[{i}]", f"{where}[{i}]", param) for i, v in enumerate(value)
            ]
            return {"tuple": items} if isinstance(value, tuple) else items
        if type(value) is dict and all(isinstance(k, str) for k in value):
            return {
                "dict": {
                    k: self.encode(v, f"{tname}[{k!r}]", f"{where}[{k!r}]", param)
                    for k, v in value.items()
                }
            }
        if type(value) in _MAPPINGS and all(isinstance(k, (str, int, float)) for k in value):
            # Other keys (MultiStepLR's milestones: a Counter of ints) as [key, value] pairs.
            return {
                "mapping": type(value).__name__,
                "items": [
                    [k, self.encode(v, f"{tname}[{k!r}]", f"{where}[{k!r}]", param)]
                    for k, v in value.items()
                ],
            }
        raise _UnstorableError(f"{where} is a {type(value).__name__}")


def _decode(value: Any, tensors: dict[str, Any]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        if value["tensor"] not in tensors:
            raise CheckpointError(
                f"malformed optimizer entry: {value['tensor']!r} is not one of its tensors"
            )
        # A fresh tensor: the optimizer updates its state in place.
        return torch.as_tensor(tensors[value["tensor"]]).clone()
    if "tuple" in value:
        return tuple(_decode(v, tensors) for v in value["tuple"])
    if "dict" in value:
        return {k: _decode(v, tensors) for k, v in value["dict"].items()}
    if value.get("mapping") in _MAPPINGS_BY_NAME:
        kind = _MAPPINGS_BY_NAME[value["mapping"]]
        return kind((k, _decode(v, tensors)) for k, v in value.get("items", []))
    raise CheckpointError(f"malformed optimizer entry: {value!r}")


# ---- schedulers --------------------------------------------------------------------------


def export_scheduler(scheduler: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """An LR scheduler's state dict: (manifest entry, tensors)."""
    schedulers = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if not isinstance(scheduler, schedulers):
        raise ArgumentError(
            "scheduler must be a torch.optim.lr_scheduler scheduler; "
            f"got scheduler={type(scheduler).__name__}"
        )
    encoder = _Encoder()
    cls = type(scheduler).__name__
    try:
        state = encoder.encode(scheduler.state_dict(), "scheduler", "state_dict()")
    except _UnstorableError as why:
        raise ArgumentError(f"scheduler {cls} cannot be stored without pickle: {why}") from None
    return {"class": cls, "state": state, "tensors": encoder.info}, encoder.tensors


def check_scheduler(
    scheduler: Any, entry: dict[str, Any], tensors: dict[str, Any]
) -> Callable[[], Any]:
    """Validates a scheduler entry against `scheduler`; returns the function that loads it."""
    cls = type(scheduler).__name__
    if cls != entry.get("class"):
        raise CheckpointError(
            f"it holds a {entry.get('class')} scheduler; the scheduler given is a {cls}"
        )
    state = _decode(entry.get("state"), tensors)
    # load_state_dict updates the scheduler's __dict__ with the stored dict: keys other than
    # the scheduler's own state (its optimizer, say) would replace its attributes.
    own = scheduler.state_dict()
    if not isinstance(state, dict) or set(state) != set(own):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"its {cls} scheduler state has keys {keys}; a {cls} has {sorted(own)}"
        )
    before = copy.deepcopy(own)

    def undo() -> None:
        scheduler.load_state_dict(copy.deepcopy(before))

    def apply() -> Any:
        try:
            scheduler.load_state_dict(state)
        except Exception as err:
            undo()
            raise CheckpointError(f"its {cls} scheduler state does not load: {err!r}") from err
        return scheduler

    apply.undo = undo  # type: ignore[attr-defined]
    return apply


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
    cls = require_optimizer(optimizer)
    names = param_names(module)
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
    cls = require_optimizer(optimizer)
    if cls != entry.get("class"):
        raise CheckpointError(
            f"it holds torch.optim.{entry.get('class')} state; the optimizer given is "
            f"torch.optim.{cls} (resume with the optimizer class that wrote it)"
        )
    names = param_names(module)
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


# ---- neutral (dualtrain_torch.optimizer_neutral), as arrays ------------------------------


def export_optimizer(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> OptimizerState:
    """The optimizer's state in neutral form (arrays), keyed by the module's parameter names.

    Raises:
        NotPortableError: the optimizer has no neutral form.
    """
    require_optimizer(optimizer)
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


def import_optimizer(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: OptimizerState
) -> torch.optim.Optimizer:
    """Fills `optimizer`'s per-parameter state from neutral `state`; returns the optimizer."""
    loaded = {name for name, _ in module.named_parameters()}
    return check_neutral(module, optimizer, state, loaded)()
