"""torch's compiled programs kept beside dualtrain's decisions, so both last as long.

TorchInductor keeps what it compiled on disk by default, in ``<tmp>/torchinductor_<user>``;
the ladder keeps its verdicts under ``cache_folder("accelerate")``. A temporary folder is
emptied on a reboot while the verdicts stay, so a run after one kept TORCH_COMPILE as decided
and paid its whole build again, the cost the decision had weighed as paid once. So, as
`dualtrain_jax.compilation.cache` names XLA's folder, the first compile dualtrain makes names
``cache_folder("inductor")`` (``$DUALTRAIN_CACHE_DIR/inductor``) as TorchInductor's, through
its own variable, ``TORCHINDUCTOR_CACHE_DIR``. TorchInductor's rules stay in force (its keys,
its FX graph cache and its atomic writes).

Left alone: a folder the user named (``TORCHINDUCTOR_CACHE_DIR``, read by TorchInductor at
each compile). TorchInductor writes its own default into the variable when torch._dynamo is
imported, so that value counts as unnamed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from dualtrain.caches import cache_folder

__all__ = ["VARIABLE", "use_disk_cache"]

VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
_lock = threading.Lock()
_chosen: list[Path | None] = []  # the decision, taken once per process


def use_disk_cache() -> Path | None:
    """Names dualtrain's folder as TorchInductor's cache, once per process.

    Returns the folder in use because of this call (None when the user or TorchInductor
    chose otherwise, or there is no folder to name: see `dualtrain.caches`).
    """
    with _lock:
        if not _chosen:
            _chosen.append(_choose())
        return _chosen[0]


def _choose() -> Path | None:
    named = os.environ.get(VARIABLE)
    if named and os.path.abspath(named) != _inductors_default():
        return None
    folder = cache_folder("inductor")
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: TorchInductor's own default, as before
        return None
    os.environ[VARIABLE] = str(folder)
    return folder


def _inductors_default() -> str | None:
    """The folder TorchInductor picks when none is named (None: this torch does not say)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return os.path.abspath(default_cache_dir())
