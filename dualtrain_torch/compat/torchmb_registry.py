"""torchmb's `AbstractBatchModule` and its registry of hand-written batch modules.

A registered batch module is a fast path for one module class (its ``base_class``): the
compat `BatchModule` calls it with the members' stacked weights and checks it against the
generic ``torch.func`` path on the first call. Its tensors carry torchmb's layout: the base
module's names, each ``[batch, *shape]`` (a shared buffer keeps the base shape).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from dualtrain.batching import members
from dualtrain.errors import ArgumentError, ShapeError, bad_argument

__all__ = [
    "BATCH_MODULES",
    "AbstractBatchModule",
    "register_batch_module",
    "register_module",
    "registered_for",
]

StateDict = dict[str, Any]


class AbstractBatchModule(nn.Module):
    """A module holding `batch` models' tensors, each ``[batch, ...]`` (torchmb's base class).

    Subclass it for a module class of yours (``base_class``), write ``from_module`` and a
    ``forward`` that takes and returns tensors in merged ``(b g)`` order (sample-major,
    member-minor: row ``b * batch + g`` is sample b of member g), and register it with
    `register_batch_module`.

    Args:
        batch: the member count, a positive int.
    """

    base_class: type[nn.Module] = nn.Module

    @classmethod
    def from_module(cls, module: nn.Module, batch: int) -> AbstractBatchModule:
        """The batch module for `module`; its weights are loaded after (they need not be)."""
        return cls(batch)

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = members.check_batch(batch)
        self._shared_buffers: list[str] = []

    @property
    def shared_buffers(self) -> tuple[str, ...]:
        """Names of the buffers every member shares (not stacked)."""
        return tuple(self._shared_buffers)

    def register_shared_buffer(
        self, name: str, tensor: torch.Tensor, persistent: bool = True
    ) -> None:
        """A buffer common to every member: `state_dicts` hands each member the same one."""
        self._shared_buffers.append(name)
        self.register_buffer(name, tensor, persistent)

    def load_state_dicts(
        self,
        state_dict_or_dicts: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        batch_strict: bool = True,
        strict: bool = True,
    ) -> None:
        """Loads one ordinary state dict into every member, or one per member.

        Args:
            state_dict_or_dicts: one single-model state dict (copied to every member) or a
                list of them (member i gets entry i).
            batch_strict: a list must hold exactly `batch` dicts; with False, fewer are
                allowed and the remaining members are zero-filled (torchmb's padding).
            strict: the keys must match this module's exactly, as in ``load_state_dict``;
                shared buffers must then be equal across the dicts.

        Raises:
            ArgumentError: a wrong count, missing or unexpected keys, or shared buffers that
                differ. ShapeError: a tensor whose shape does not fit. Nothing is loaded then.
        """
        stacked = self._stacked(state_dict_or_dicts, batch_strict, strict)
        own = self.state_dict()
        missing = [k for k in own if k not in stacked]
        extra = [k for k in stacked if k not in own]
        if strict and (missing or extra):
            raise ArgumentError(
                f"state_dict_or_dicts must have this module's keys; it lacks {missing} and "
                f"has {extra} beyond them"
            )
        for key, value in stacked.items():
            if key in own and tuple(value.shape) != tuple(own[key].shape):
                raise ShapeError(
                    f"state_dict_or_dicts[{key!r}] must stack to {tuple(own[key].shape)} "
                    f"(batch={self.batch} first, but for a shared buffer); got "
                    f"{tuple(value.shape)}"
                )
        self.load_state_dict({k: v for k, v in stacked.items() if k in own}, strict=False)

    def _stacked(self, given: Any, batch_strict: bool, strict: bool) -> dict[str, torch.Tensor]:
        shared = set(self.shared_buffers)
        if isinstance(given, Mapping):
            one = {k: torch.as_tensor(v) for k, v in given.items()}
            return {
                k: v if k in shared else v.unsqueeze(0).expand(self.batch, *v.shape)
                for k, v in one.items()
            }
        if not isinstance(given, Sequence) or isinstance(given, (str, bytes)) or not given:
            raise bad_argument(
                "state_dict_or_dicts", given, "a state dict or a non-empty list of them"
            )
        pad = self.batch - len(given)
        if pad < 0 or (batch_strict and pad > 0):
            raise bad_argument(
                "state_dict_or_dicts",
                f"<{len(given)} state dicts>",
                f"{self.batch} state dicts (one per member"
                + (", or fewer with batch_strict=False)" if pad > 0 else ")"),
            )
        for i, d in enumerate(given):
            if not isinstance(d, Mapping):
                raise bad_argument(f"state_dict_or_dicts[{i}]", d, "a state dict")
            if i and set(d) != set(given[0]):
                # The keys are read from the first dict: others' extra keys were dropped.
                missing = [k for k in given[0] if k not in d]
                extra = [k for k in d if k not in given[0]]
                raise ArgumentError(
                    f"state_dict_or_dicts[{i}] must have the keys of state_dict_or_dicts[0]; "
                    f"it lacks {missing} and has {extra} beyond them"
                )
        out: dict[str, torch.Tensor] = {}
        for key in given[0]:
            values = [torch.as_tensor(d[key]) for d in given]
            for i, v in enumerate(values[1:], start=1):
                if v.shape != values[0].shape:
                    raise ShapeError(
                        f"state_dict_or_dicts[{i}][{key!r}] must have the shape it has in "
                        f"state_dict_or_dicts[0], {tuple(values[0].shape)}; got "
                        f"{tuple(v.shape)}"
                    )
            if key in shared:
                if strict and any(not torch.equal(v, values[0]) for v in values[1:]):
                    raise ArgumentError(
                        f"state_dict_or_dicts must hold the same shared buffer {key!r} in "
                        f"every dict; it differs"
                    )
                out[key] = values[0]
                continue
            rows = torch.stack(values)
            if pad:
                rows = torch.cat([rows, rows.new_zeros((pad, *rows.shape[1:]))])
            out[key] = rows
        return out

    def state_dicts(self, device: Any = None) -> list[StateDict]:
        """One ordinary state dict per member (shared buffers given to every member)."""
        states: list[StateDict] = [{} for _ in range(self.batch)]
        shared = set(self.shared_buffers)
        for key, value in self.state_dict().items():
            value = value.to(device) if device is not None else value
            if key in shared:
                for s in states:
                    s[key] = value
                continue
            if value.ndim == 0 or value.shape[0] != self.batch:
                raise ShapeError(
                    f"state tensor {key!r} must be [batch, ...] with batch={self.batch}; got "
                    f"shape {tuple(value.shape)}"
                )
            for s, row in zip(states, value, strict=True):
                s[key] = row
        return states

    def extra_repr(self) -> str:
        return f"batch={self.batch}"


# base class -> its batch module; torchmb looks modules up by exact type, so do we.
BATCH_MODULES: dict[type[nn.Module], type[AbstractBatchModule]] = {}

B = TypeVar("B", bound=type[nn.Module])


def register_batch_module(cls: B) -> B:
    """Registers a batch module for its ``base_class``; returns `cls` (a decorator too).

    As torchmb's README writes it, `cls` may also be the base class itself: the one
    `AbstractBatchModule` subclass that names it as its ``base_class`` is registered (of a
    class defined several times under one name, the latest definition).

    Raises:
        ArgumentError: `cls` is not a class; a batch module that leaves ``base_class`` at
            ``nn.Module``; a base class no batch module names, or several do.
    """
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise bad_argument("cls", cls, "an AbstractBatchModule subclass or its base class")
    if issubclass(cls, AbstractBatchModule):
        base = cls.base_class
        if base is nn.Module or not (isinstance(base, type) and issubclass(base, nn.Module)):
            raise bad_argument(
                "cls", cls, "a batch module whose base_class names the module class it batches"
            )
        BATCH_MODULES[base] = cls
        return cls
    if cls is nn.Module:
        raise bad_argument("cls", cls, "a module class of yours, not nn.Module itself")
    found = [c for c in _subclasses(AbstractBatchModule) if c.__dict__.get("base_class") is cls]
    # One class defined again (a notebook cell run twice) counts once: its latest definition.
    latest = {(c.__module__, c.__qualname__): c for c in found}
    found = list(latest.values())
    if len(found) != 1:
        names = [c.__name__ for c in found]
        raise ArgumentError(
            f"register_batch_module got the module class {cls.__name__}: exactly one "
            f"AbstractBatchModule subclass must have base_class = {cls.__name__}; "
            + (f"found {names}: pass the one to use" if names else "found none: define it first")
        )
    BATCH_MODULES[cls] = found[0]
    return cls


register_module = register_batch_module  # the name torchmb's README gives it in prose


def registered_for(module: nn.Module) -> type[AbstractBatchModule] | None:
    """The batch module registered for ``type(module)``, or None."""
    return BATCH_MODULES.get(type(module))


def _subclasses(cls: type[AbstractBatchModule]) -> list[type[AbstractBatchModule]]:
    out: list[type[AbstractBatchModule]] = []
    todo: list[Callable[[], list[Any]]] = [cls.__subclasses__]
    while todo:
        for sub in todo.pop()():
            out.append(sub)
            todo.append(sub.__subclasses__)
    return out
