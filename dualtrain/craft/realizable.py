"""What every adapter's ``realize`` refuses before building anything: the same checks, once."""

from __future__ import annotations

from typing import Any

from dualtrain.backend_contract import display_name
from dualtrain.craft.craft import Craft
from dualtrain.errors import bad_argument

__all__ = ["check_realizable"]


def check_realizable(craft: Any, backend: str) -> Craft:
    """`craft`, refused unless `backend`'s ``realize`` can build it.

    Args:
        craft: what was passed to ``realize``.
        backend: the adapter's name (``"torch"``, ``"jax"``).

    Raises:
        ArgumentError: `craft` is not a Craft.
        TypeError: it holds native layers of another framework (a torch module is torch's,
            a `dock.Native` its `backend`'s); the message names them and their adapter.
    """
    if not isinstance(craft, Craft):
        raise bad_argument("craft", craft, "a dualtrain.Craft instance")
    foreign: dict[str, list[str]] = {}
    for name, part in craft.natives():
        owner = getattr(part, "backend", "torch")
        if owner != backend:
            foreign.setdefault(owner, []).append(name)
    for owner, names in foreign.items():  # two frameworks: at most one other owner
        raise TypeError(
            f"{type(craft).__name__} holds {display_name(owner)}-native layers {names}; "
            f"realize it with dualtrain_{owner}"
        )
    return craft
