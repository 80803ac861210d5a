"""The cockpit under torch: CUDA numbers as ``torch.device``, an Engine as a device.

The JAX adapter's ``cockpit`` module has the same names (`dualtrain.cockpit.seams`).
"""

from __future__ import annotations

from typing import Any

import torch

from dualtrain.cockpit.engine import Engine
from dualtrain.errors import bad_argument

__all__ = ["as_device", "devices", "place"]


def devices(ordinals: tuple[int, ...], /) -> list[torch.device]:
    """``cuda:<n>`` for each ordinal (checked against ``torch.cuda.device_count()``)."""
    if not ordinals:
        return [torch.device("cpu")]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bad = [n for n in ordinals if not 0 <= n < count]
    if bad:
        raise bad_argument("ordinals", tuple(ordinals), f"CUDA numbers below {count} (torch)")
    return [torch.device("cuda", n) for n in ordinals]


def as_device(device: Any) -> Any:
    """`device` itself, or for an `Engine` its ``torch.device`` for this process."""
    return device.torch_device if isinstance(device, Engine) else device


def place(target: Any, device: Any, /) -> Any:
    """A module (moved in place, returned) or tensors (a pytree, copied) on `device`."""
    device = as_device(device)
    if isinstance(target, torch.nn.Module):
        return target.to(device)
    return _moved(target, device)


def _moved(tree: Any, device: Any) -> Any:
    """Tensors in dicts, lists and tuples moved (autograd history kept); others as they are."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return type(tree)((k, _moved(v, device)) for k, v in tree.items())
    if isinstance(tree, (list, tuple)):
        items = [_moved(v, device) for v in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return tree
