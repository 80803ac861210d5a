"""Nebulae's ``config``: the dict its classes take first, holding their other arguments.

dualtrain's helper for the compat classes (not a Nebulae module).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dualtrain.errors import bad_argument

__all__ = ["from_config"]


def from_config(config: object, owner: str, given: dict[str, Any]) -> dict[str, Any]:
    """The arguments `given` by keyword, each replaced by `config`'s value where it names it.

    Raises:
        ArgumentError: `config` is neither None nor a dict (the message names `owner`).
    """
    if config is None:
        return given
    if not isinstance(config, Mapping):
        raise bad_argument("config", config, f"None or a dict of {owner}'s arguments")
    return {name: config.get(name, value) for name, value in given.items()}
