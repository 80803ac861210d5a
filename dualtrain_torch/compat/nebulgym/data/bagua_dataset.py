"""nebulgym's ``BaguaDataset(input_data)``: bagua's cached dataset, or a NebulDataset.

nebulgym wrapped ``bagua.torch_api.contrib.cached_dataset.CachedDataset`` when bagua was
installed and a `NebulDataset` otherwise (``CachedDataset`` was then that class). Here it is
always a `NebulDataset` with nebulgym's defaults: dualtrain keeps no cache in Redis.
"""

from __future__ import annotations

from typing import Any

from dualtrain_torch.compat.nebulgym.data.nebuly_dataset import NebulDataset

__all__ = ["BaguaDataset", "CachedDataset"]

CachedDataset = NebulDataset  # what nebulgym's module bound without bagua


class BaguaDataset(NebulDataset):
    """`input_data`'s items cached in memory: a `NebulDataset` with nebulgym's defaults.

    Args:
        input_data: the dataset (anything with ``__getitem__`` and ``__len__``).
    """

    def __init__(self, input_data: Any) -> None:
        super().__init__(input_data)
