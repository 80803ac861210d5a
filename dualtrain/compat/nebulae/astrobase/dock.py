"""Nebulae's ``nebulae.astrobase.dock`` under torch (dualtrain_torch.compat.nebulae_dock).

The module is torch's, as Nebulae's was under its PYTORCH core: importing it loads torch
(``import dualtrain`` and ``import dualtrain.compat.nebulae`` do not). Its names, and
what each maps to in dualtrain, are in that module and in docs/migration.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from dualtrain import backends

backends.load("torch")  # a clear error when torch is not installed
_dock: Any = importlib.import_module("dualtrain_torch.compat.nebulae_dock")
globals().update({name: getattr(_dock, name) for name in _dock.__all__})
__all__: list[str] = list(_dock.__all__)


def __getattr__(name: str) -> Any:
    """Nebulae's dock names not carried over: a RetiredError saying what to use instead."""
    return getattr(_dock, name)
