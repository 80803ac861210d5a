"""torchmb's type names (``torchmb.types``), for annotations in code migrating from it.

torchmb's tables that sorted functions and modules for its ``torch.fx`` rewrite
(``ELEMENTWISE_FUNCS`` and the like) have no job here, where every function and module runs
per member through ``torch.func``: asking for one raises `MovedNameError` saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from dualtrain_torch.compat.torchmb.moved import moved_names

__all__ = [
    "DataOrder",
    "ForwardFunc",
    "IntOrInts",
    "Size",
    "StateDict",
    "TensorOrTensors",
    "Tensors",
]

StateDict = dict[str, Any]
# Where the members sit in a tensor: [G, B, ...], [B, G, ...], or one flattened dimension.
DataOrder = Literal["g b", "(g b)", "b g", "(b g)"]
ForwardFunc = Callable[[torch.Tensor], torch.Tensor]
Tensors = tuple[torch.Tensor, ...]
TensorOrTensors = torch.Tensor | Tensors
Size = torch.Size | tuple[int, ...]
IntOrInts = int | Size

_NO_TABLES = (
    "dualtrain runs every function and module per member through torch.func, so nothing "
    "needs sorting into element-wise, batch-independent or batch-dependent: write the model "
    "as for one member and wrap it in BatchModule(model, batch); to_batch_func(func, batch) "
    "runs one function per member"
)

__getattr__ = moved_names(
    __name__,
    {
        "ELEMENTWISE_FUNCS": _NO_TABLES,
        "BATCH_INDEPENDENT_FUNCS": _NO_TABLES,
        "PARAMETER_FREE_ELEMENTWISE_MODULES": _NO_TABLES,
        "BATCH_DEPENDENT_MODULES": _NO_TABLES,
    },
)
