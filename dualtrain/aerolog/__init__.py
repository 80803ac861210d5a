"""Aerolog: the cockpit's logs and dashboard (as in Nebulae): `DashBoard`.

Checkpoints moved to `dualtrain.checkpoint`; their names are still found here, with a
DeprecationWarning, until the next minor release.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from dualtrain.aerolog.dashboard import DashBoard

__all__ = ["DashBoard"]

_MOVED = {
    "CheckpointError": "dualtrain.errors",
    "OptimizerState": "dualtrain.checkpoint",
    "Restored": "dualtrain.checkpoint",
    "TimeMachine": "dualtrain.checkpoint",
}


def __getattr__(name: str) -> Any:
    """The checkpoint names that lived here, from their new home, with a DeprecationWarning."""
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'dualtrain.aerolog' has no attribute {name!r}")
    warnings.warn(
        f"dualtrain.aerolog.{name} moved to {home}.{name}; import it from there "
        "(the old name goes in the next minor release)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)
