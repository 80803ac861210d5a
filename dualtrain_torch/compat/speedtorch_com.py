# ruff: noqa: N802, N803
"""SpeedTorch's co-occurrence matrices: ``COM``, ``COMMM`` and the torch ``...COM`` classes.

A [total_classes, total_classes] matrix of zeros that ``comInit()`` allocates, for counting
which classes occur together. SpeedTorch's torch classes (``PytorchCOM``,
``GPUPytorchCOM``, ``CPUPytorchCOM``) raised AttributeError in ``comInit`` (they read an
``embed_dimension`` they never had) and ``COMMM``'s raised NameError; here all of them
allocate the matrix. The CuPy ones hold a NumPy array (``CUPYCom``, or ``CUPYmemmap`` in a
``.npy`` file for ``COMMM``), the torch ones a tensor (``pytorchGPUVar`` /
``pytorchCPUVar``), under SpeedTorch's attribute names.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import torch

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.validate import check_int
from dualtrain_torch.compat.speedtorch_files import save_npy, save_tensors
from dualtrain_torch.compat.speedtorch_rows import check_flag, free_name, transfer_to

__all__ = ["COM", "COMMM", "CPUPytorchCOM", "GPUPytorchCOM", "PytorchCOM"]

M = TypeVar("M", np.ndarray, torch.Tensor)  # a matrix: a CuPy class's array, a torch one's tensor


def _numpy_dtype(datatype: Any) -> np.dtype:
    try:
        if isinstance(datatype, torch.dtype):
            return np.dtype(str(datatype).removeprefix("torch."))
        dtype = np.dtype(datatype)
    except TypeError:
        dtype = np.dtype(object)
    if dtype.kind not in "iuf":
        raise bad_argument("datatype", datatype, "an int or float dtype for counts")
    return dtype


def _made(matrix: M | None) -> M:
    """`matrix`, once ``comInit()`` made it."""
    if matrix is None:
        raise ArgumentError("call comInit() before reading or saving the matrix")
    return matrix


class COM:
    """SpeedTorch's CuPy co-occurrence matrix (``SpeedTorch.CUPYLive``).

    Args:
        total_classes: the matrix is [total_classes, total_classes].
        datatype: an int or float dtype (NumPy name or torch dtype); default "uint32".
        CPUPinn: a bool, accepted for SpeedTorch compatibility.

    Attributes:
        CUPYCom: the matrix (a NumPy array) once ``comInit()`` ran, else None.
    """

    def __init__(self, total_classes: int, datatype: Any = "uint32", CPUPinn: bool = False) -> None:
        self.total_classes = check_int("total_classes", total_classes, minimum=1)
        self.datatype = _numpy_dtype(datatype)
        self.CPUPinn = check_flag("CPUPinn", CPUPinn)
        self.CUPYCom: np.ndarray | None = None

    def comInit(self, CPUPinn: bool = False) -> None:
        """Allocates the matrix of zeros (``CPUPinn`` is checked, as SpeedTorch ignored it)."""
        check_flag("CPUPinn", CPUPinn)
        n = self.total_classes
        self.CUPYCom = np.zeros((n, n), self.datatype)

    def getNumpyVersion(self) -> np.ndarray:
        """The matrix (live, not a copy)."""
        return _made(self.CUPYCom)

    def saveCupy(self, saveFileName: str) -> None:
        """Saves the matrix as ``cupy.save`` does: a .npy file (``.npy`` appended if missing)."""
        save_npy(saveFileName, _made(self.CUPYCom))


class COMMM(COM):
    """SpeedTorch's memory-mapped co-occurrence matrix (``SpeedTorch.CPUCupyPinned``).

    ``comInit()`` puts the matrix of zeros in a new ``.npy`` file,
    ``{diskname}{n}.memmap.cpy.npy`` with the first free n, memory-mapped.

    Args:
        total_classes, datatype, CPUPinn: as `COM`.
        diskname: the file name's stem.

    Attributes:
        CUPYmemmap: the memory-mapped matrix once ``comInit()`` ran, else None.
        fileName: its file, once made.
    """

    def __init__(
        self,
        total_classes: int,
        diskname: str = "COM",
        datatype: Any = "uint32",
        CPUPinn: bool = False,
    ) -> None:
        if not isinstance(diskname, str) or not diskname:
            raise bad_argument("diskname", diskname, "a file name stem (a non-empty str)")
        super().__init__(total_classes, datatype, CPUPinn)
        self.diskname = diskname
        self.fileName: str | None = None

    @property
    def CUPYmemmap(self) -> np.ndarray | None:
        """The memory-mapped matrix (SpeedTorch's attribute name)."""
        return self.CUPYCom

    def comInit(self, CPUPinn: bool = False) -> None:
        """Makes the file and maps the matrix of zeros from it."""
        check_flag("CPUPinn", CPUPinn)
        path = free_name(self.diskname, ".memmap.cpy.npy")
        n = self.total_classes
        self.CUPYCom = np.lib.format.open_memmap(path, "w+", self.datatype, (n, n))
        self.fileName = str(path)


class PytorchCOM:
    """SpeedTorch's torch co-occurrence matrix (``SpeedTorch.GenTorch``).

    Args:
        total_classes: the matrix is [total_classes, total_classes].
        datatype: a torch int or float dtype; default ``torch.int32``.

    Attributes:
        pytorchGPUVar: the matrix (a tensor) once ``comInit()`` ran, else None.
    """

    _device: str | None = None  # None: "cuda" when present, else "cpu"

    def __init__(self, total_classes: int, datatype: Any = torch.int32) -> None:
        self.total_classes = check_int("total_classes", total_classes, minimum=1)
        if not isinstance(datatype, torch.dtype) or datatype.is_complex or datatype == torch.bool:
            raise bad_argument("datatype", datatype, "a torch int or float dtype")
        self.dtype = datatype
        self.pytorchGPUVar: torch.Tensor | None = None

    def comInit(self) -> None:
        """Allocates the matrix of zeros on the device."""
        n = self.total_classes
        device = transfer_to(self._device).device
        self.pytorchGPUVar = torch.zeros((n, n), dtype=self.dtype, device=device)

    def getTorchVar(self) -> torch.Tensor:
        """The matrix tensor."""
        return _made(self.pytorchGPUVar)

    def getNumpyVersion(self) -> np.ndarray:
        """The matrix as a NumPy array (a copy when it is on a GPU)."""
        return _made(self.pytorchGPUVar).cpu().numpy()

    def saveTorch(self, saveFileName: str) -> None:
        """Saves the matrix with ``torch.save`` to exactly `saveFileName`."""
        save_tensors(saveFileName, _made(self.pytorchGPUVar))


class GPUPytorchCOM(PytorchCOM):
    """SpeedTorch's CUDA co-occurrence matrix (``SpeedTorch.GPUTorch``): on "cuda" when present."""


class CPUPytorchCOM(PytorchCOM):
    """SpeedTorch's pinned-CPU co-occurrence matrix (``SpeedTorch.CPUTorchPinned``).

    Attributes:
        pytorchCPUVar: the matrix, on the CPU (SpeedTorch's attribute name).
    """

    _device = "cpu"

    @property
    def pytorchCPUVar(self) -> torch.Tensor | None:
        """The matrix (SpeedTorch's attribute name for this class)."""
        return self.pytorchGPUVar
