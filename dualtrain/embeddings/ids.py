"""Row ids of one batch: checked once, then deduplicated.

A batch's ids are validated with one min/max pass (so every later gather can skip bounds
checks) and reduced to the sorted unique rows plus, per occurrence, the position of its
row among them. Gradients of repeated ids are then summed per unique row by the adapters
(torch's autograd through `index_select`, JAX's `segment_sum`), so no update is lost.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, DtypeError, OutOfRangeError

__all__ = ["Lookup", "as_ids", "lookup"]


@dataclasses.dataclass(frozen=True)
class Lookup:
    """One batch's rows.

    Attributes:
        unique: sorted unique row ids, int64 [U].
        inverse: per occurrence, its row's position in `unique`, int64 [N] (all parts joined).
        ids: the validated id arrays as given (int64), in order.
    """

    unique: np.ndarray
    inverse: np.ndarray
    ids: tuple[np.ndarray, ...]

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape of each id array given, in order."""
        return tuple(a.shape for a in self.ids)

    def same_ids(self, other: Lookup) -> bool:
        """Whether `other` was made from equal id arrays."""
        return len(self.ids) == len(other.ids) and all(
            a.shape == b.shape and np.array_equal(a, b)
            for a, b in zip(self.ids, other.ids, strict=False)
        )

    @property
    def parts(self) -> list[np.ndarray]:
        """`inverse` split back into one array per id array given, each in its shape."""
        out, start = [], 0
        for shape in self.shapes:
            n = int(np.prod(shape, dtype=np.int64))
            out.append(self.inverse[start : start + n].reshape(shape))
            start += n
        return out


def as_ids(ids: Any, num_rows: int, name: str = "ids") -> np.ndarray:
    """`ids` as an int64 NumPy array, every value checked to lie in [0, num_rows).

    Accepts NumPy arrays, CPU torch tensors and JAX arrays (through ``np.asarray``), and
    Python sequences. Raises DtypeError for non-integer ids and OutOfRangeError (an
    ArgumentError and an IndexError) naming the first bad id and its position.
    """
    arr = np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids)
    if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        if arr.size == 0 and arr.dtype == np.float64:  # np.asarray([]) is float64
            arr = arr.astype(np.int64)
        else:
            raise DtypeError(f"{name} must be integer row ids; got dtype {arr.dtype}")
    if arr.size:
        lo, hi = arr.min(), arr.max()
        if lo < 0 or hi >= num_rows:
            bad = np.flatnonzero((arr.ravel() < 0) | (arr.ravel() >= num_rows))[0]
            position = np.unravel_index(bad, arr.shape)
            raise OutOfRangeError(
                f"{name} holds row id {arr.ravel()[bad]} at position {tuple(map(int, position))};"
                f" expected ids in [0, {num_rows})"
            )
    return arr.astype(np.int64, copy=False)


def lookup(id_arrays: tuple[Any, ...], num_rows: int) -> Lookup:
    """Validates `id_arrays` and returns their joint unique rows and inverse."""
    if not id_arrays:
        raise ArgumentError("fetch needs at least one array of row ids")
    arrays = [
        as_ids(a, num_rows, "ids" if len(id_arrays) == 1 else f"ids[{i}]")
        for i, a in enumerate(id_arrays)
    ]
    flat = np.concatenate([a.ravel() for a in arrays])
    unique, inverse = np.unique(flat, return_inverse=True)
    return Lookup(unique, inverse.astype(np.int64, copy=False), tuple(arrays))
