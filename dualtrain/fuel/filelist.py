"""Reading and checking the CSV file list of a FuelGenerator.

The header row names the keys; the first column holds the data files (relative to
`file_dir`), or with ``is_seq`` a quoted, comma-separated list of frame files; the other
columns hold values typed by `dtype`. Each bad row is reported by file, line and column.

The file is UTF-8 (a leading byte-order mark is dropped). Lines are physical lines of the
file: a quoted cell spanning lines counts them all, and a row is named by its first line.
A row holding bytes that are not UTF-8 is a bad row (skippable); a broken CSV structure (a
field over ``csv.field_size_limit()``, a NUL byte) stops the read, naming the line.
Data files must resolve (symbolic links followed) inside `file_dir`, unless
``allow_outside``.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import io
import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dualtrain.errors import DtypeError, PackError, bad_argument
from dualtrain.fuel.columns import ColumnType, parse_cell
from dualtrain.fuel.layout import META_KEY

__all__ = ["RESERVED_SUFFIXES", "FileList", "Row", "SkippedRow", "read_file_list"]

# Dataset names the pack derives from a column's key (see dualtrain.fuel.layout), and the
# writer's own working names: a column named so would overwrite another's data.
RESERVED_SUFFIXES = (".offsets", ".frames", ".exif", ".ends", ".counts")
_UNDECODED = re.compile("[\udc80-\udcff]")  # bytes kept by errors="surrogateescape"


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
    allow_outside: bool = False,
) -> FileList:
    """Reads and checks every row (files exist, values parse and fit their types).

    Raises:
        PackError: a bad row and ``on_error="raise"``; always for a bad header (keys that
            repeat, are empty or clash with the pack's own dataset names) or a broken CSV.
    """
    records = _records(path, delimiter, quotechar)
    if not records:
        raise PackError(f"file_list {path!r} is empty; expected a header row of keys")
    header_line, header_cells = records[0]
    if not any(cell.strip() for cell in header_cells):
        # csv gives a blank first line as [], which would read as a header of no keys.
        raise PackError(
            f"file_list {path!r}, line {header_line}: empty header; the first line must "
            "name the keys (remove blank lines before it)"
        )
    bad = _undecoded(header_cells)
    if bad is not None:
        raise PackError(f"file_list {path!r}, line {header_line}: the header {bad}")
    header = [h.strip() for h in header_cells]
    columns = _column_types(path, header, dtype)
    good: list[Row] = []
    listing = FileList(path, columns, good, [])
    root = os.path.realpath(file_dir)
    shapes: dict[str, tuple[int, ...]] = {}  # the first good row's shape, per fixed column
    for number, cells in records[1:]:
        if not cells:  # csv gives blank lines as []
            continue
        try:
            row = _read_row(listing, number, cells, (file_dir, root, allow_outside), is_seq)
            _check_shapes(listing, row, shapes)
            good.append(row)
        except PackError as e:
            if on_error == "raise":
                raise
            listing.skipped.append(SkippedRow(number, *e.args[1:]))
    return listing


def _records(path: str, delimiter: str, quotechar: str) -> list[tuple[int, list[str]]]:
    """(first line, cells) of every record; bytes that are not UTF-8 kept as surrogates."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PackError(f"file_list {path!r} cannot be read: {e}") from e
    text = data.decode("utf-8-sig", errors="surrogateescape")
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quotechar=quotechar)
    records: list[tuple[int, list[str]]] = []
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return records
        except csv.Error as e:
            raise PackError(
                f"file_list {path!r}, line {reader.line_num}: not a readable CSV record ({e})"
            ) from e
        records.append((start, cells))


def _undecoded(cells: list[str]) -> str | None:
    """Why a record's text is not UTF-8 (its first undecodable byte), or None."""
    for i, cell in enumerate(cells):
        found = _UNDECODED.search(cell)
        if found is not None:
            byte = ord(found.group()) - 0xDC00
            return f"is not UTF-8 text: byte 0x{byte:02x} in cell {i + 1}"
    return None


def _column_types(
    path: str, header: list[str], dtype: Sequence[str] | Mapping[str, str]
) -> dict[str, ColumnType]:
    if len(set(header)) != len(header) or not all(header):
        raise PackError(f"file_list {path!r}, line 1: header keys must be unique and non-empty")
    for key in header:
        clash = _clash(key)
        if clash is not None:
            raise PackError(
                f"file_list {path!r}, line 1: column {key!r} {clash}; rename the column"
            )
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


def _clash(key: str) -> str | None:
    """Why a column key cannot name a pack dataset, or None."""
    if key == META_KEY:
        return f"is the name of the pack's metadata ({META_KEY!r})"
    if key.endswith(RESERVED_SUFFIXES):
        return f"ends in a name the pack gives its own datasets {list(RESERVED_SUFFIXES)}"
    if "/" in key or "\x00" in key or key in (".", ".."):
        return "holds '/' or a NUL byte, or is '.' or '..' (HDF5 path syntax)"
    return None


def _read_row(
    listing: FileList,
    line: int,
    cells: list[str],
    where: tuple[str, str, bool],
    is_seq: bool,
) -> Row:
    file_dir, root, allow_outside = where
    keys = list(listing.columns)
    bad = _undecoded(cells)
    if bad is not None:
        raise _RowError(listing, line, keys[0], f"the row {bad}")
    for key, cell in zip(keys, cells, strict=False):
        if "\x00" in cell:  # no file name holds one, and a str value would be cut at it
            raise _RowError(listing, line, key, f"cell {cell!r} holds a NUL byte")
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
        if not allow_outside and not _inside(os.path.realpath(file), root):
            raise _RowError(
                listing, line, keys[0],
                f"file {file!r} resolves to {os.path.realpath(file)!r}, outside file_dir "
                f"{root!r}; pass allow_outside=True to FuelGenerator to accept it",
            )  # fmt: skip
        problem = _not_a_file(file)
        if problem is not None:
            raise _RowError(listing, line, keys[0], f"file {file!r} {problem}")
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


def _not_a_file(path: str) -> str | None:
    """Why `path` is not a regular file to read an image from, or None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a broken symbolic link (to {os.readlink(path)!r})"
        return "does not exist"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        return f"cannot be examined: {e.strerror or e}"
    if stat.S_ISREG(mode):
        return None
    kinds = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket")]  # fmt: skip
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"is {kind}, not a regular file"


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives (Windows)
        return False


class _RowError(PackError):
    """A PackError that keeps its column and reason for the skip report."""

    def __init__(self, listing: FileList, line: int, column: str, reason: str) -> None:
        super().__init__(str(listing.error(line, column, reason)), column, reason)

    def __str__(self) -> str:
        return str(self.args[0])
