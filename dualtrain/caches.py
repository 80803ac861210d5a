"""Where dualtrain keeps what it measured on this machine, so a second run skips it.

One folder per kind (``accelerate``: the compile ladder's verdicts; ``batching``: model
batching's strategy decisions) under ``$DUALTRAIN_CACHE_DIR``, else
``$XDG_CACHE_HOME/dualtrain``, else ``~/.cache/dualtrain``. Read at each use, so a
process that changes the variable is followed.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_folder"]


def cache_folder(kind: str) -> Path:
    """The folder for `kind`'s cached decisions (not created here)."""
    root = os.environ.get("DUALTRAIN_CACHE_DIR")
    if root:
        return Path(root) / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "dualtrain" / kind
