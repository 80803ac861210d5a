"""Nebulae's ``nebulae.toolkit``: ``Timer``, ``autoPad``, ``GPUtil`` and ``destine``."""

from __future__ import annotations

import importlib.util
import random

import numpy as np

from dualtrain.compat.nebulae.toolkit.decorator import Timer
from dualtrain.compat.nebulae.toolkit.utility import GPUtil, autoPad
from dualtrain.validate import check_seed

__all__ = ["GPUtil", "Timer", "autoPad", "destine"]


def destine(seed: int) -> None:
    """Seeds Python's `random`, NumPy's global generator and torch's (CPU and CUDA).

    The Comburant's draws come from `random`, and Nebulae layers' initializers from torch.
    """
    seed = check_seed("seed", seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - Nebulae's programs draw from it
    if importlib.util.find_spec("torch") is not None:
        importlib.import_module("torch").manual_seed(seed)  # CUDA's generators too
