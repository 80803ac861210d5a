"""torch.optim.lr_scheduler state in an anchor, and the pickle-free state-dict encoding.

A scheduler's ``state_dict()`` goes to the manifest's JSON, its tensors (if any) to the file
as ``scheduler...``. `_Encoder` and `_decode`, which turn a state dict into tensors plus JSON
and back, are shared with ``dualtrain_torch.optimizer_state``.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dualtrain import convert, dtypes
from dualtrain.errors import ArgumentError, CheckpointError

__all__ = ["check_scheduler", "export_scheduler"]

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
