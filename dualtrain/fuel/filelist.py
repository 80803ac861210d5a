"""Reading and checking the CSV file list of a FuelGenerator.

The header row names the keys; the first column holds the data files (relative to
`file_dir`), or with ``is_seq`` a quoted, comma-separated list of frame files; the other
columns hold values typed by `dtype`. Each bad row is reported by file, line and column.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dualtrain.errors import DtypeError, PackError, bad_argument
from dualtrain.fuel.columns import ColumnType, parse_cell

__all__ = ["FileList", "Row", "SkippedRow", "read_file_list"]


@dataclasses.dataclass(frozen=True)
class Row:
    """One good row: its CSV line, the data files (absolute), the parsed values by key."""

    line: int
    files: tuple[str, ...]
    values: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class SkippedRow:
    """A row left out under ``on_error="skip"``, with the reason."""

    line: int
    column: str
    reason: str


@dataclasses.dataclass(frozen=True)
class FileList:
    """A parsed file list: the column types by key (CSV order), the good rows, the bad."""

    path: str
    columns: dict[str, ColumnType]
    rows: list[Row]
    skipped: list[SkippedRow]

    @property
    def image_key(self) -> str:
        """The key of the first column, the data files."""
        return next(iter(self.columns))

    def error(self, line: int, column: str, reason: str) -> PackError:
        """The house error for a bad row."""
        return PackError(f"file_list {self.path!r}, line {line}, column {column!r}: {reason}")


def read_file_list(
    path: str,
    file_dir: str,
    dtype: Sequence[str] | Mapping[str, str],
    *,
    is_seq: bool,
    delimiter: str,
    quotechar: str,
    on_error: str,
) -> FileList:
    """Reads and checks every row (files exist, values parse and fit their types).

    Raises:
        PackError: a bad row and ``on_error="raise"``; always for a bad header.
    """
    with open(path, newline="", encoding="utf-8") as f:
        lines = list(csv.reader(f, delimiter=delimiter, quotechar=quotechar))
    if not lines:
        raise PackError(f"file_list {path!r} is empty; expected a header row of keys")
    header = [h.strip() for h in lines[0]]
    columns = _column_types(path, header, dtype)
    good: list[Row] = []
    listing = FileList(path, columns, good, [])
    shapes: dict[str, tuple[int, ...]] = {}  # the first good row's shape, per fixed column
    for number, cells in enumerate(lines[1:], start=2):
        if not cells:  # csv gives blank lines as []
            continue
        try:
            row = _read_row(listing, number, cells, file_dir, is_seq)
            _check_shapes(listing, row, shapes)
            good.append(row)
        except PackError as e:
            if on_error == "raise":
                raise
            listing.skipped.append(SkippedRow(number, *e.args[1:]))
    return listing


def _column_types(
    path: str, header: list[str], dtype: Sequence[str] | Mapping[str, str]
) -> dict[str, ColumnType]:
    if len(set(header)) != len(header) or not all(header):
        raise PackError(f"file_list {path!r}, line 1: header keys must be unique and non-empty")
    if isinstance(dtype, Mapping):
        missing = [k for k in header[1:] if k not in dtype]
        if missing:
            raise bad_argument("dtype", dict(dtype), f"a type for every column; missing {missing}")
        types = [dtype.get(header[0], "vuint8"), *(dtype[k] for k in header[1:])]
    else:
        types = list(dtype)
        if len(types) == len(header) - 1:  # the image column's type may be left out
            types.insert(0, "vuint8")
        if len(types) != len(header):
            raise bad_argument(
                "dtype", dtype, f"one type per column of {path!r} ({len(header)}: {header})"
            )
    columns = {k: ColumnType.parse(t, f"dtype[{k!r}]") for k, t in zip(header, types, strict=True)}
    if columns[header[0]].name != "vuint8":
        raise bad_argument(
            f"dtype[{header[0]!r}]", columns[header[0]].name, "'vuint8' (encoded image bytes)"
        )
    return columns


def _read_row(listing: FileList, line: int, cells: list[str], file_dir: str, is_seq: bool) -> Row:
    keys = list(listing.columns)
    if len(cells) != len(keys):
        raise _RowError(
            listing,
            line,
            keys[min(len(cells), len(keys) - 1)],
            f"has {len(cells)} cells; the header has {len(keys)}",
        )
    names = [n.strip() for n in cells[0].split(",")] if is_seq else [cells[0].strip()]
    files = tuple(os.path.join(file_dir, n) for n in names if n)
    if not files:
        raise _RowError(listing, line, keys[0], "names no file")
    for file in files:
        if not os.path.isfile(file):
            raise _RowError(listing, line, keys[0], f"file {file!r} does not exist")
    values: dict[str, Any] = {}
    for key, cell in zip(keys[1:], cells[1:], strict=True):
        try:
            values[key] = parse_cell(cell, listing.columns[key])
        except DtypeError as e:
            raise _RowError(listing, line, key, f"{e} (type {listing.columns[key].name})") from None
    return Row(line, files, values)


def _check_shapes(listing: FileList, row: Row, shapes: dict[str, tuple[int, ...]]) -> None:
    fixed = {k: v for k, v in row.values.items() if not listing.columns[k].variable}
    for key, value in fixed.items():
        shape = shapes.get(key, getattr(value, "shape", ()))
        if getattr(value, "shape", ()) != shape:
            raise _RowError(
                listing, row.line, key,
                f"holds {value.size} values where earlier rows held {int(np.prod(shape))}; "
                f"a column of varying length needs a 'v' type",
            )  # fmt: skip
    for key, value in fixed.items():
        shapes.setdefault(key, getattr(value, "shape", ()))


class _RowError(PackError):
    """A PackError that keeps its column and reason for the skip report."""

    def __init__(self, listing: FileList, line: int, column: str, reason: str) -> None:
        super().__init__(str(listing.error(line, column, reason)), column, reason)

    def __str__(self) -> str:
        return str(self.args[0])
