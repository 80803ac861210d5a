"""nebulgym's ``BaseDataset``: an abstract torch Dataset around the data it is given."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from torch.utils.data import Dataset

__all__ = ["BaseDataset"]


class BaseDataset(Dataset[Any], ABC):
    """An abstract torch ``Dataset`` holding `input_data` (as ``self._data``).

    Subclasses define ``__len__`` and ``__getitem__``.

    Args:
        input_data: the data the subclass serves.
    """

    def __init__(self, input_data: Any) -> None:
        self._data = input_data

    @abstractmethod
    def __len__(self) -> int:
        raise NotImplementedError

    @abstractmethod
    def __getitem__(self, item: Any) -> Any:
        raise NotImplementedError
