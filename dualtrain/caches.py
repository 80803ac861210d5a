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


def cache_folder(kind: str) -> Path | None:
    """The folder for `kind`'s cached decisions (not created here).

    None where there is none to name: no variable set and no home directory (a container
    run under a user id without a passwd entry); decisions are then kept in memory only.
    """
    root = os.environ.get("DUALTRAIN_CACHE_DIR")
    if root:
        return Path(root) / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    try:
        base = Path(xdg) if xdg else Path.home() / ".cache"
    except (RuntimeError, KeyError, OSError):
        return None
    return base / "dualtrain" / kind
