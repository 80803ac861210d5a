"""What the SpeedTorch shim's factories share: the batch in hand, its gradient, the table's init.

SpeedTorch's layout is kept: the small ``nn.Embedding`` holds one row per id *occurrence*
(positives, then negatives), and ``variableTransformer``'s local ids are ``arange``. Unlike
SpeedTorch, repeated ids are right. A gradient hook on the small embedding sums the
gradients of every occurrence of a row and gives each occurrence that sum; the copies of a
row start equal (weights and optimizer state come from one table row), get the same
gradient and so take the same element-wise step, and one copy per row is written back. The
result is what ``attach(..., mode="lazy")`` computes on the unique rows.

The factories' arguments are checked here too, by SpeedTorch's names (`check_shape`,
`dtype_name`, `check_flag`, `transfer_for`), and a table can live in a ``.npy`` file on
disk (`adopt_memmap`, SpeedTorch's memmap classes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dualtrain import dtypes
from dualtrain.embeddings import EmbeddingStore, Lookup, lookup
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.interop import convert
from dualtrain.validate import check_int
from dualtrain_torch.transfer import Transfer

__all__ = [
    "Swapped",
    "adopt_memmap",
    "check_flag",
    "check_shape",
    "dtype_name",
    "fill_like_torch",
    "fill_seeded",
    "free_name",
    "occurrence_rows",
    "sum_repeats",
    "transfer_for",
    "transfer_to",
]


def transfer_to(device_type: Any = None) -> Transfer:
    """The road for rows to `device_type` (default "cuda" when present, else "cpu")."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return Transfer(device_type)


def transfer_for(name: str, device_type: Any) -> Transfer:
    """`transfer_to(device_type)`, a bad device named as the SpeedTorch argument `name`."""
    try:
        return transfer_to(device_type)
    except ArgumentError as err:
        raise bad_argument(
            name, device_type, f"None ('cuda' when present, else 'cpu') or a device here ({err})"
        ) from err


def check_shape(total_classes: Any, embed_dimension: Any) -> tuple[int, int]:
    """The table's shape, checked under SpeedTorch's argument names."""
    return (
        check_int("total_classes", total_classes, minimum=1),
        check_int("embed_dimension", embed_dimension, minimum=1),
    )


def dtype_name(name: str, datatype: Any) -> str:
    """A table's dtype (a NumPy name or a torch dtype) as the store's name, or ArgumentError."""
    try:
        if isinstance(datatype, torch.dtype):
            text = str(datatype).removeprefix("torch.")
        elif datatype is None:  # np.dtype(None) is float64; SpeedTorch's default was float32
            text = ""
        else:
            text = "bfloat16" if datatype == "bfloat16" else str(np.dtype(datatype))
    except TypeError:
        text = ""
    if text not in dtypes.FLOAT_NAMES:
        raise bad_argument(name, datatype, f"a float dtype of a table ({dtypes.FLOAT_NAMES})")
    return text


def check_flag(name: str, value: Any) -> bool:
    """A SpeedTorch on/off argument (``CPUPinn``, ``pinType``) as a bool, or ArgumentError."""
    if not isinstance(value, (bool, np.bool_)):
        raise bad_argument(name, value, "True or False")
    return bool(value)


def free_name(stem: str, suffix: str) -> Path:
    """``{stem}{n}{suffix}`` for the first n from 0 naming no file, as SpeedTorch numbered."""
    n = 0
    while Path(f"{stem}{n}{suffix}").exists():
        n += 1
    return Path(f"{stem}{n}{suffix}")


def adopt_memmap(store: EmbeddingStore, path: str | os.PathLike) -> np.ndarray:
    """Moves `store`'s table into a new ``.npy`` file at `path`, memory-mapped; returns it.

    The table keeps its values; from now on it is the file's pages (what SpeedTorch's
    memmap classes held). The store has no public way to take a table, so this sets its
    array; nothing trains the store meanwhile (the shim's stores are never attached).
    """
    table = store.table
    mapped = np.lib.format.open_memmap(path, mode="w+", dtype=table.dtype, shape=table.shape)
    mapped[...] = table
    store._table = mapped  # the store's live array (EmbeddingStore.live)
    return mapped


class Swapped:
    """The batch in hand between beforeForwardPass and afterOptimizerStep.

    Attributes:
        found: the batch's ids, unique rows and inverse (None before the first batch).
        first: per unique row, the position of its first occurrence.
    """

    def __init__(self) -> None:
        self.found: Lookup | None = None
        self.first = np.zeros(0, np.int64)

    def begin(self, ids: tuple[Any, ...], num_rows: int) -> Lookup:
        found = lookup(ids, num_rows)
        flat = found.unique[found.inverse]
        _, self.first = np.unique(flat, return_index=True)
        self.found = found
        return found

    def same(self, ids: tuple[Any, ...], num_rows: int) -> Lookup:
        found = lookup(ids, num_rows)
        if self.found is None or not found.same_ids(self.found):
            raise ArgumentError(
                "afterOptimizerStep got other ids than beforeForwardPass; pass the same ones"
            )
        return self.found


def occurrence_rows(table: np.ndarray, found: Lookup) -> np.ndarray:
    """`table`'s row of every id occurrence, in order ([N, dim]: SpeedTorch's layout)."""
    rows = np.empty((found.inverse.size, table.shape[1]), table.dtype)
    # Ids were range-checked in `lookup`; "clip" skips NumPy's slower checked gather.
    np.take(table, found.unique[found.inverse], axis=0, out=rows, mode="clip")
    return rows


def sum_repeats(grad: torch.Tensor, inverse: torch.Tensor, unique: int) -> torch.Tensor:
    """`grad` ([N, dim], one row per occurrence) with each row the sum over its id's rows.

    A sparse gradient (``nn.Embedding(sparse=True)``) stays sparse: it holds every occurrence
    of each id that had a row in it, so SparseAdam and Adagrad update every copy alike.
    """
    shape = (unique, *grad.shape[1:])
    if grad.is_sparse:
        g = grad.coalesce()
        rows = inverse.index_select(0, g.indices()[0])
        summed = torch.zeros(shape, dtype=grad.dtype, device=grad.device)
        summed.index_add_(0, rows, g.values())
        hit = torch.zeros(unique, dtype=torch.bool, device=grad.device)
        hit[rows] = True
        keep = torch.nonzero(hit[inverse]).squeeze(1)
        values = summed.index_select(0, inverse.index_select(0, keep))
        return torch.sparse_coo_tensor(
            keep.unsqueeze(0), values, grad.shape, is_coalesced=True, check_invariants=False
        )
    summed = torch.zeros(shape, dtype=grad.dtype, device=grad.device)
    summed.index_add_(0, inverse, grad)  # the order attach's index_select backward adds in
    return summed.index_select(0, inverse)


def fill_like_torch(store: EmbeddingStore, init: Any, *args: Any, **kwargs: Any) -> None:
    """``init(table, *args, **kwargs)`` on the whole table as a tensor, as SpeedTorch did.

    Torch's global generator, the table's shape (fan-in and fan-out) and dtype: SpeedTorch's
    torch factories' numbers on the CPU.
    """
    with store.held():  # an attachment of the store steps nothing while it is refilled
        table = convert(store.table, to="torch")
        with torch.no_grad():
            init(table, *args, **kwargs)
        shared = table.data_ptr() == store.table.__array_interface__["data"][0]
        if not shared:  # a dtype torch could not view in place: copy the filled table back
            store.table[...] = convert(table, to="numpy")


def fill_seeded(store: EmbeddingStore, draw: Any, seed: int) -> None:
    """The store's own fill, exactly what ``EmbeddingStore(..., init=draw, seed=seed)`` holds.

    Row r comes from ``draw(rows, rng)`` on the stream of (seed, r's block).
    """
    store.initialize(draw, seed=seed)
