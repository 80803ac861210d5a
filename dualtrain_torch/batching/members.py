"""The members of a torch BatchModule: stacked storage, architectures, independent draws."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from dualtrain.batching import members
from dualtrain.errors import bad_argument
from dualtrain_torch.craft import CraftModule

__all__ = [
    "Stack",
    "copy_module",
    "draw_members",
    "entries_of",
    "kind_of",
    "non_persistent",
]


class Stack(nn.Module):
    """Holds the stacked tensors under their members' names (``fc.weight``).

    The BatchModule's ``state_dict`` then reads ``stack.fc.weight``, shape ``[batch, ...]``.
    """

    def put(
        self,
        name: str,
        value: torch.Tensor,
        parameter: bool,
        *,
        requires_grad: bool = True,
        persistent: bool = True,
    ) -> None:
        """Stores `value` under `name`; `requires_grad` and `persistent` follow the member's."""
        *path, last = name.split(".")
        holder: nn.Module = self
        for part in path:
            # Straight into _modules: names like "train" are module attributes (as in craft.py).
            holder = holder._modules.setdefault(part, nn.Module())  # type: ignore[assignment]
        if parameter:
            trainable = requires_grad and value.is_floating_point()
            holder._parameters[last] = nn.Parameter(value, requires_grad=trainable)
        else:
            holder._buffers[last] = value
            if not persistent:  # left out of state_dict(), as the member leaves it out
                holder._non_persistent_buffers_set.add(last)


def entries_of(module: nn.Module) -> list[members.Entry]:
    """Every parameter, then buffer: (name, shape, dtype name, trainable)."""
    out: list[members.Entry] = []
    for name, p in module.named_parameters():
        out.append((name, tuple(p.shape), str(p.dtype).removeprefix("torch."), True))
    for name, b in module.named_buffers():
        out.append((name, tuple(b.shape), str(b.dtype).removeprefix("torch."), False))
    return out


def non_persistent(module: nn.Module) -> set[str]:
    """The full names of the buffers `module` leaves out of its ``state_dict``."""
    return {
        f"{prefix}.{name}" if prefix else name
        for prefix, m in module.named_modules()
        for name in m._non_persistent_buffers_set
    }


def copy_module(module: nn.Module) -> nn.Module:
    """A deep copy (a realized Craft copies whole: its layer table follows its layers)."""
    return copy.deepcopy(module)


def kind_of(module: nn.Module) -> str:
    """The architecture's class name, for messages and the cache key."""
    if isinstance(module, CraftModule):
        return f"{type(module.craft).__qualname__} (a realized Craft)"
    return type(module).__qualname__


def draw_members(
    template: nn.Module, targets: dict[str, torch.Tensor], seeds: Sequence[int]
) -> None:
    """Fills row i of each stacked tensor in `targets` from seed i, one member at a time.

    A realized Craft draws as `realize` does (the core's NumPy init for the seed); any other
    module re-runs every submodule's ``reset_parameters`` on one scratch copy, under
    ``torch.manual_seed(seed % 2**63)``, once per member: never N modules at once.

    Raises:
        ArgumentError: a submodule holds parameters but has no ``reset_parameters``.
    """
    if isinstance(template, CraftModule):
        dtype = next(iter(targets.values())).dtype
        for i, s in enumerate(seeds):
            values = template.craft.init(s, str(dtype).removeprefix("torch."))
            with torch.no_grad():
                for name, value in values.items():
                    targets[name][i].copy_(torch.as_tensor(value))
        return
    bare = [
        n
        for n, m in template.named_modules()
        if any(True for _ in m.parameters(recurse=False)) and _reset(m) is None
    ]
    if bare:
        raise bad_argument(
            "init",
            "independent",
            f"'identical' or BatchModule.from_modules([...]) here: the submodules {bare} "
            "hold parameters but have no reset_parameters() to draw them again",
        )
    scratch = copy_module(template)  # one scratch copy, re-drawn once per member
    device = next(iter(targets.values())).device
    for i, s in enumerate(seeds):
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(s % 2**63)  # torch seeds are int64
            for m in scratch.modules():
                reset = _reset(m)
                if reset is not None:
                    reset()
        drawn = dict(scratch.named_parameters()) | dict(scratch.named_buffers())
        with torch.no_grad():
            for name, target in targets.items():
                target[i].copy_(drawn[name])


def _reset(module: nn.Module) -> Callable[[], None] | None:
    """The module's own initializer, ``reset_parameters`` or ``_reset_parameters``.

    MultiheadAttention and the like name theirs with the underscore.
    """
    for name in ("reset_parameters", "_reset_parameters"):
        fn = getattr(module, name, None)
        if callable(fn):
            return fn
    return None
