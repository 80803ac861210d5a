"""torchmb's `AbstractBatchModule` (``torchmb.base``): `batch` models' tensors in one module.

Its tensors carry torchmb's layout: the base module's names, each ``[batch, *shape]`` (a
shared buffer keeps the base shape); its ``forward`` takes and returns tensors in merged
``(b g)`` order. `load_state_dicts` and `state_dicts` move members in and out as ordinary
state dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from dualtrain.batching import members
from dualtrain.errors import ArgumentError, ShapeError, bad_argument
from dualtrain_torch.compat.torchmb.types import StateDict

__all__ = ["AbstractBatchModule"]


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
