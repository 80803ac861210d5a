"""SpeedTorch's DataGadget: rows of a ``.npy`` file served to torch by id, and written back.

`DataGadgetMM` is SpeedTorch's memory-mapped twin: the file's pages are the data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dualtrain.embeddings import as_ids
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_torch.compat.speedtorch_files import load_npy, save_npy
from dualtrain_torch.compat.speedtorch_rows import check_flag, transfer_to

__all__ = ["DataGadget", "DataGadgetMM"]


class DataGadget:
    """Rows of a ``.npy`` file served to torch by id, and written back.

    Args:
        fileName: the ``.npy`` file (a 2-D array).
        CPUPinn: a bool, accepted for compatibility; pinned when CUDA is present.
    """

    def __init__(self, fileName: str, CPUPinn: bool = False) -> None:
        self.CPUPinn = check_flag("CPUPinn", CPUPinn)
        self.fileName = fileName
        self.data: np.ndarray | None = None
        self.transfer = transfer_to()
        self.device = self.transfer.device

    def gadgetInit(self) -> None:
        """Loads the file (a 2-D array, read without pickle)."""
        loaded = load_npy(self.fileName, "fileName")
        if loaded.ndim != 2:
            raise bad_argument("fileName", self.fileName, "a .npy file of a 2-D array")
        self.data = np.array(loaded)

    def _table(self) -> np.ndarray:
        if self.data is None:
            raise ArgumentError("call gadgetInit() before getData/insertData")
        return self.data

    def getData(self, indexes: Any) -> torch.Tensor:
        """The rows of `indexes` (any shape of ids) as a tensor on the device."""
        table = self._table()
        ids = as_ids(indexes, len(table), "indexes")
        return self.transfer(np.take(table, ids, axis=0))

    def insertData(self, dataObject: torch.Tensor, indexes: Any) -> None:
        """Writes rows; of repeated ids the last occurrence wins (always, unlike SpeedTorch)."""
        table = self._table()
        ids = as_ids(indexes, len(table), "indexes").ravel()
        values = dataObject.detach().cpu().numpy()
        if values.size != ids.size * int(np.prod(table.shape[1:], dtype=np.int64)):
            raise bad_argument(
                "dataObject",
                tuple(values.shape),
                f"{ids.size} rows of shape {tuple(table.shape[1:])} (one per index)",
            )
        values = values.reshape(ids.size, *table.shape[1:])
        table[ids] = values  # NumPy assigns in order, so the last occurrence is what stays

    def getNumpyVersion(self) -> np.ndarray:
        """The data as a NumPy array."""
        return self._table()

    def getCupyVar(self) -> np.ndarray:
        """The data (SpeedTorch's CuPy array; here the live NumPy array)."""
        return self._table()

    def saveCupy(self, saveFileName: str) -> None:
        """Saves the data as ``cupy.save`` does: a .npy file (``.npy`` appended if missing)."""
        save_npy(saveFileName, self._table())

    def loadCupy(self, loadFileName: str) -> None:
        """Replaces the data with a 2-D array from a .npy file, as SpeedTorch's loadCupy."""
        loaded = load_npy(loadFileName, "loadFileName")
        if loaded.ndim != 2:
            raise bad_argument("loadFileName", loadFileName, "a .npy file of a 2-D array")
        self.data = np.array(loaded)


class DataGadgetMM(DataGadget):
    """SpeedTorch's memory-mapped DataGadget (``SpeedTorch.CPUCupyPinned``).

    ``gadgetInit()`` maps the ``.npy`` file read-write: rows written with ``insertData``
    go to the file. SpeedTorch's class raised NameError when made; its ``getData`` took
    positive and negative ids, as the factories do.

    Args:
        fileName: the ``.npy`` file (a 2-D array).
        CPUPinn: a bool, accepted for compatibility.
    """

    def gadgetInit(self) -> None:
        """Maps the file (a 2-D array, read without pickle) read-write."""
        loaded = load_npy(self.fileName, "fileName")
        if loaded.ndim != 2:
            raise bad_argument("fileName", self.fileName, "a .npy file of a 2-D array")
        path = getattr(loaded, "filename", None) or self.fileName
        self.data = np.load(path, mmap_mode="r+", allow_pickle=False)

    def getData(self, retrievedPosIndexes: Any, retrievedNegIndexes: Any = None) -> torch.Tensor:
        """The rows of the positive ids, then of the negative ones, as one [N, dim] tensor."""
        table = self._table()
        ids = [as_ids(retrievedPosIndexes, len(table), "retrievedPosIndexes").ravel()]
        if retrievedNegIndexes is not None:
            ids.append(as_ids(retrievedNegIndexes, len(table), "retrievedNegIndexes").ravel())
        return self.transfer(np.take(table, np.concatenate(ids), axis=0))

    def getCupyMM(self) -> np.ndarray:
        """The memory-mapped data (SpeedTorch's CuPy memmap)."""
        return self._table()
