"""ColumnGather: a batch's numeric columns of one shape, each read by one gather.

A Tank with no fetch_fn, prep_fn, collate_fn or preload serves its columns of kind
``"value"`` whose cells share one shape (numbers and fixed-size vectors) this way: one
`Column.take` per column for a whole batch, or for one worker's part of it, cast to the
served dtype and checked as a row-by-row read checks it. Images, sequences and str or
variable-length columns are still read row by row. The batches are equal to the row-by-row
ones, value for value and dtype for dtype, and so are the errors (the first row, then the
first column, that fails); tests/fuel/test_gather.py says so. One exception: a
``cast="unsafe"`` of a float that is not finite or out of an integer type's range has no
defined result, and NumPy's whole-batch and one-row loops may give different ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from dualtrain.fuel.casts import Served, check_value, first_lost
from dualtrain.fuel.columns import ColumnType
from dualtrain.fuel.pack import Pack

__all__ = ["ColumnGather", "Lost", "gathered_keys"]

# key, shape, dtype -> the array the rows of that column go into (a part of the batch's)
Blocks = Callable[[str, tuple[int, ...], np.dtype], np.ndarray]


def gathered_keys(pack: Pack, spec: Mapping[str, Served]) -> list[str]:
    """The served columns a gather can read: kind "value", numeric, one shape in every row."""
    out = []
    for key, served in spec.items():
        entry = pack.columns[key]
        fixed = entry["kind"] == "value" and not ColumnType.parse(entry["type"]).variable
        if fixed and served.base != "str":
            out.append(key)
    return out


class ColumnGather:
    """Reads the gathered columns of a set of rows (picklable: it holds no file).

    Args:
        pack: the pack the Tank reads.
        spec: the Tank's served columns; only `gathered_keys` of it are read here.
    """

    def __init__(self, pack: Pack, spec: Mapping[str, Served]) -> None:
        self.spec = {key: spec[key] for key in gathered_keys(pack, spec)}
        self.shapes = {key: tuple(pack.columns[key]["shape"]) for key in self.spec}
        # Per key: the served dtype, and whether it is the stored one (gathered in place).
        self.dtypes = {key: served.dtype for key, served in self.spec.items()}
        self.as_stored = {key: served.dtype == served.stored for key, served in self.spec.items()}

    @property
    def keys(self) -> list[str]:
        return list(self.spec)

    def __call__(
        self, pack: Pack, rows: np.ndarray, blocks: Blocks | None = None
    ) -> tuple[dict[str, np.ndarray], Lost | None]:
        """Each column's ``(len(rows), *shape)`` values (served dtype), and what a cast lost.

        `blocks(key, shape, dtype)`, when given, is where each column's values go (a part
        of the batch's array, filled in place); else fresh arrays are returned. A checked
        cast that changed a value raises nothing here: the `Lost` names the first row (then
        the first column) where one did, and `Lost.raise_` raises its PackError. The caller
        reads the rows before it row by row first, so that the error raised is the one a
        row-by-row read, row after row and column after column, stops at.
        """
        shapes, dtypes, as_stored = self.shapes, self.dtypes, self.as_stored
        n = len(rows)

        def target(key: str) -> np.ndarray | None:
            if blocks is None:
                return None
            return blocks(key, (n, *shapes[key]), dtypes[key])

        def stored_into(key: str) -> np.ndarray | None:  # the others are cast below
            return target(key) if as_stored[key] else None

        # Columns served as stored go straight into the batch. The rows are the Tank's
        # order's, in range by construction.
        read = pack.take(list(self.spec), rows, stored_into, in_range=True)
        lost: Lost | None = None
        for key, served in self.spec.items():
            if self.as_stored[key]:
                continue
            stored = read[key]
            into = target(key)
            if into is None:
                into = np.empty(stored.shape, served.dtype)
            if served.checked:
                with np.errstate(over="ignore", invalid="ignore"):
                    np.copyto(into, stored, casting="unsafe")
                first = first_lost(rows, stored, into)
                if first is not None and (lost is None or first < lost.position):
                    lost = Lost(first, key, int(rows[first]), stored[first], into[first])
            else:  # NumPy's astype, its warnings included, as a row-by-row read casts
                np.copyto(into, stored, casting="unsafe")
            read[key] = into
        return read, lost


class Lost(NamedTuple):
    """The first value a gathered cast changed: its place in the rows and its column."""

    position: int  # in the rows gathered
    key: str
    row: int  # the pack row
    stored: np.ndarray
    served: np.ndarray

    def raise_(self) -> None:
        """Raises the PackError a row-by-row read of this cell raises."""
        check_value(self.key, self.row, self.stored, self.served)
