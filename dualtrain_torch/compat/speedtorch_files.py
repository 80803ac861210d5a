"""The SpeedTorch shim's files: what saveCupy/saveTorch write and loadCupy/loadTorch read.

Written through `dualtrain.atomic` (a killed writer never leaves half a file); read with
checks of shape and dtype against the table before anything is assigned.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dualtrain import atomic
from dualtrain.errors import DtypeError, bad_argument
from dualtrain.interop import convert

__all__ = ["checked", "load_npy", "load_tensors", "save_atomic", "save_npy", "save_tensors"]


def save_atomic(target: Path, write: Any) -> None:
    """`write(file)` through dualtrain's one atomic writer: a crash never leaves half a file."""
    with atomic.atomic_target(target) as tmp, open(tmp, "wb") as f:
        write(f)


def save_npy(path: str | os.PathLike, array: np.ndarray) -> None:
    """``cupy.save``'s file: NumPy's .npy format, ``.npy`` appended when the name lacks it."""
    target = Path(path) if str(path).endswith(".npy") else Path(f"{path}.npy")
    save_atomic(target, lambda f: np.save(f, array, allow_pickle=False))


def load_npy(path: str | os.PathLike, name: str) -> np.ndarray:
    """A .npy file as ``cupy.load`` reads it; ``"table"`` also finds what saveCupy wrote."""
    target = Path(path)
    if not target.exists() and Path(f"{path}.npy").exists():
        target = Path(f"{path}.npy")
    try:
        return np.load(target, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise bad_argument(name, str(path), "a .npy file of a numeric array") from err


def save_tensors(path: str | os.PathLike, value: Any) -> None:
    """``torch.save`` to exactly `path`, as SpeedTorch's saveTorch does, atomically."""
    save_atomic(Path(path), lambda f: torch.save(value, f))


def load_tensors(path: str | os.PathLike, name: str) -> Any:
    """A ``torch.save`` file read onto the CPU with ``weights_only=True``: no code in it runs."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as err:
        raise bad_argument(
            name, str(path), "a file written by torch.save holding tensors (weights_only=True)"
        ) from err


def checked(table: np.ndarray, loaded: Any, path: Any, name: str) -> np.ndarray:
    """`loaded` (a tensor or array) as an array, once its shape and dtype match `table`."""
    if isinstance(loaded, torch.Tensor):
        try:
            got = convert(loaded, to="numpy")
        except DtypeError as err:  # float8, quantized, sparse: no table holds that
            raise bad_argument(name, str(path), f"a file of a {table.dtype} table") from err
    elif isinstance(loaded, np.ndarray):
        got = loaded
    else:
        raise bad_argument(
            name, str(path), f"a file holding one tensor (it holds a {type(loaded).__name__})"
        )
    if got.shape != table.shape or got.dtype != table.dtype:
        raise bad_argument(
            name,
            str(path),
            f"a file of a {table.dtype} table of shape {table.shape} "
            f"(it holds {got.dtype} {got.shape})",
        )
    return got
