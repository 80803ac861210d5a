"""Nebulae's ``nebulae.astrobase``: ``dock`` (layers, losses, optimizers) and ``hangar``.

``dock`` is torch's (Nebulae v0.5 ran one framework a process): importing it loads torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["dock", "hangar"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
