"""Pinned staging for the preloader: held tensors and arrays in page-locked memory on CUDA.

`dualtrain.preload.Preloader(pin_memory="torch")` passes each item through `pin` before
holding it, so a later ``.to("cuda", non_blocking=True)`` copies without a staging copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dualtrain.preload.sizes import map_leaves

__all__ = ["pin"]


def pin(item: Any, /) -> Any:
    """`item` with its CPU tensors and NumPy arrays in pinned memory (the item without CUDA).

    NumPy arrays stay NumPy arrays (views of a pinned tensor, which they keep alive).
    """
    if not torch.cuda.is_available():
        return item
    return map_leaves(item, _pin_leaf)


def _pin_leaf(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x if x.device.type != "cpu" or x.is_pinned() else x.pin_memory()
    if isinstance(x, np.ndarray) and x.dtype != object:
        try:
            tensor = torch.from_numpy(np.ascontiguousarray(x))
        except TypeError:  # a dtype torch does not have: left in pageable memory
            return x
        return tensor.pin_memory().numpy()
    return x
