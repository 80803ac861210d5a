"""Pack: reads a pack (one file or its shards) row by row.

Files are opened lazily, on the first read in each process, and the open handles are not
pickled, so a Pack can be handed to worker processes (each opens its own handles, which h5py
needs). Contiguous HDF5 datasets (FuelGenerator writes no other kind) are mapped into memory,
so a row is a slice of the page cache: no h5py call, no lock, no GIL held. Offsets are read
once per file and kept. npz
files are read whole on first use (npz members cannot be sliced on disk): npz suits packs
that fit in memory, HDF5 any size.

A pack is checked when it is opened: its metadata, every dataset's shape and dtype against
it, the shards against each other (one `generate` run, every shard once), and each offsets
array when first read (monotone, within its values). Each file's identity (device, inode,
size, mtime) is recorded then; `Pack.check` compares it with the file on disk, so a file
truncated, rewritten or replaced under a reader is a PackError, not a SIGBUS of the mapping.
Every row read is preceded by a check at most a millisecond old (one stat per ms at most),
and a Tank checks the files of each part of a batch before and after reading it.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dualtrain.errors import PackError, bad_argument
from dualtrain.fuel.columns import ColumnType
from dualtrain.fuel.packcheck import check_set, layout
from dualtrain.fuel.packfile import PackFile

__all__ = ["Column", "Pack"]


class Pack:
    """A pack of one or more files, indexed by row across them.

    Args:
        data_path: a pack file, or a list of shards (read in the given order).

    Attributes:
        columns: key -> its metadata (``type``, ``kind``, ``shape`` for fixed columns).
        image: the stored image size and encoding (``height``, ``width``, ``channel``,
            ``encode``).
        exif: whether the first column's EXIF blocks are kept, as column ``<key>.exif``.
    """

    def __init__(self, data_path: str | os.PathLike[str] | Sequence[Any]) -> None:
        paths = [data_path] if isinstance(data_path, (str, os.PathLike)) else list(data_path)
        if not paths:
            raise bad_argument("data_path", data_path, "a pack file or a non-empty list")
        self._files = [PackFile(os.fspath(p)) for p in paths]
        check_set(self._files)
        first = self._files[0].meta
        # JSON sorts the column dict; "keys" keeps the CSV order.
        self.columns: dict[str, dict[str, Any]] = {k: first["columns"][k] for k in first["keys"]}
        self.image: dict[str, Any] = first.get("image", {})
        self.exif: bool = bool(first.get("exif", False))
        self._column_cache: dict[str, Column] = {}
        self._takeable: set[str] = set()  # keys `take` has checked
        self._starts = np.cumsum([0] + [f.meta["count"] for f in self._files]).tolist()

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def paths(self) -> list[str]:
        """The pack's files, in reading order."""
        return [f.path for f in self._files]

    @property
    def generation(self) -> tuple[tuple[int, int, int, int], ...]:
        """The identities (device, inode, size, mtime) of the files, as opened now.

        Different after the pack was replaced on disk and opened again (after `close`).
        """
        self._reopen_if_closed()
        return tuple(f.identity for f in self._files)

    @property
    def shards(self) -> list[list[int]]:
        """Each file's [shard index, rows], in reading order (shard 0 for packs before ids)."""
        return [[int(f.meta.get("shard", 0)), int(f.meta["count"])] for f in self._files]

    def check(self, rows: np.ndarray | None = None) -> None:
        """Raises PackError if a file (holding any of `rows`; None: every file) changed.

        One `os.stat` per file. Tank calls it before and after preparing each part of a
        batch; direct readers of `pack[key][i]` call it when they want the same guard.
        """
        self._reopen_if_closed()
        if rows is None or len(self._files) == 1:
            files = self._files
        else:
            shards = np.searchsorted(self._starts, np.asarray(rows), side="right") - 1
            files = [self._files[int(i)] for i in np.unique(shards)]
        for f in files:
            f.check()

    @property
    def keys(self) -> list[str]:
        """The column keys, in CSV order."""
        return list(self.columns)

    def locate(self, index: int) -> tuple[PackFile, int]:
        """The file holding row `index` and the row's index inside it."""
        self._reopen_if_closed()
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is out of range for a pack of {len(self)} rows")
        shard = bisect.bisect_right(self._starts, index) - 1
        return self._files[shard], index - self._starts[shard]

    def __getitem__(self, key: str) -> Column:
        column = self._column_cache.get(key)
        if column is not None:
            return column
        exif = self.exif and key.endswith(".exif") and key[:-5] in self.columns
        if key not in self.columns and not exif:
            keys = self.keys + [f"{k}.exif" for k in self.keys if self.exif and k == self.keys[0]]
            raise bad_argument("key", key, f"one of the pack's columns {keys}")
        column = self._column_cache[key] = Column(self, key)
        return column

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_column_cache": {}}

    def close(self) -> None:
        """Closes every open file and forgets it.

        A later read opens the files again, checking that they still make one pack of the
        same layout (rows per file, columns, image settings): a pack regenerated in place is
        read after `close`.
        """
        for f in self._files:
            f.close()
        self._closed = True

    def _reopen_if_closed(self) -> None:
        if not getattr(self, "_closed", False):
            return
        with _REOPEN_LOCK:
            if not self._closed:
                return
            files = [PackFile(f.path) for f in self._files]
            check_set(files)
            for old, new in zip(self._files, files, strict=True):
                was, now = layout(old.meta), layout(new.meta)
                if was != now:
                    diffs = ", ".join(
                        f"{k} {was[k]!r} -> {now[k]!r}" for k in was if was[k] != now[k]
                    )
                    raise PackError(
                        f"{new.path}: the pack file was replaced by one of another layout "
                        f"while it was closed ({diffs}); open it with a new Tank or Pack"
                    )
            self._files, self._column_cache, self._closed = files, {}, False

    def take(
        self,
        keys: Sequence[str],
        rows: Any,
        outs: Callable[[str], np.ndarray | None] | None = None,
        *,
        in_range: bool = False,
    ) -> dict[str, np.ndarray]:
        """Rows `rows` of numeric columns of one shape each, as stored (`Column.take`).

        Args:
            keys: the columns, each of kind "value" with a fixed-size type.
            rows: a 1-D array (or sequence) of int row indices, in any order, repeats allowed.
            outs: ``outs(key)`` is the array to fill for `key`, of shape
                ``(len(rows), *shape)`` and the stored dtype, or None for a fresh one.
            in_range: the caller vouches that every row of an int64 `rows` lies in
                ``[0, len(pack))`` (a Tank's own order): the pass over them that checks it
                is skipped.

        Returns:
            key -> ``(len(rows), *shape)`` values; one gather per column per file holding
            any of the rows. The rows are checked once, whatever the number of columns.
        """
        for key in keys:
            if key in self._takeable:
                continue
            column = self[key]
            if column.kind != "value" or column.type.variable:
                raise bad_argument(
                    "key", key, "a numeric column of one shape for take() (not an image, "
                    "sequence, str or variable-length column: read those row by row)"
                )  # fmt: skip
            self._takeable.add(key)
        index = rows if type(rows) is np.ndarray else np.asarray(rows)
        if index.ndim != 1 or (index.size and index.dtype.kind not in "iu"):
            raise bad_argument("rows", rows, "a 1-D array of int row indices")
        if index.dtype != np.int64:
            index = index.astype(np.int64)
        n = int(self._starts[-1])
        # One pass: a negative index read as uint64 is above any row count.
        if (
            index.size
            and not (in_range and index is rows)
            and int(index.view(np.uint64).max()) >= n
        ):
            bad = int(index[(index < 0) | (index >= n)][0])
            raise IndexError(f"row {bad} is out of range for a pack of {n} rows")
        self._reopen_if_closed()
        files, out = self._files, {}
        # Each read is preceded by a guard (a check at most a millisecond old).
        if len(files) == 1:
            for key in keys:
                files[0].guard()
                out[key] = files[0].take(key, index, None if outs is None else outs(key))
            return out
        shard = np.searchsorted(self._starts, index, side="right") - 1
        parts = [(s, shard == s) for s in np.unique(shard).tolist()]
        for key in keys:
            entry = self.columns[key]
            into = None if outs is None else outs(key)
            if into is None:
                into = np.empty(
                    (len(index), *entry["shape"]), ColumnType.parse(entry["type"]).dtype
                )  # fmt: skip
            for s, mask in parts:
                files[s].guard()
                into[mask] = files[s].take(key, index[mask] - self._starts[s])
            out[key] = into
        return out

    def row(self, index: int) -> dict[str, Any]:
        """Every column of row `index` (see `Column.__getitem__` for the value types)."""
        return {key: self[key][index] for key in self.columns}


class Column:
    """One column of a pack; ``column[i]`` reads row i.

    Row values: a NumPy scalar or array for numeric columns (1-D for ``v`` types), a str for
    ``"str"``, the encoded bytes as a 1-D uint8 array for images, a list of those for
    sequences.
    """

    def __init__(self, pack: Pack, key: str) -> None:
        self.pack = pack
        self.key = key
        meta = pack.columns.get(key, {"type": "vuint8", "kind": "exif"})
        self.kind: str = meta["kind"]
        self.type = ColumnType.parse(meta["type"])

    def __len__(self) -> int:
        return len(self.pack)

    def take(self, rows: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Rows `rows` of a numeric column of one shape at once, as stored.

        Args:
            rows: a 1-D array (or sequence) of int row indices, in any order, repeats allowed.
            out: an array of shape ``(len(rows), *shape)`` and the stored dtype to fill.

        Returns:
            ``(len(rows), *shape)`` values, equal to ``np.stack([column[i] for i in rows])``:
            one gather per file holding any of the rows, no Python per row.
        """
        return self.pack.take([self.key], rows, None if out is None else lambda key: out)[self.key]

    def __getitem__(self, index: int) -> Any:
        f, i = self.pack.locate(int(index))
        f.guard()  # the file is the one opened, as of a millisecond ago at most
        if self.kind == "sequence":
            frames = f.whole(f"{self.key}.frames")
            offsets = f.whole(f"{self.key}.offsets")
            lo, hi = int(frames[i]), int(frames[i + 1])
            flat = f.part(self.key, int(offsets[lo]), int(offsets[hi]))
            base = int(offsets[lo])
            return [flat[offsets[j] - base : offsets[j + 1] - base] for j in range(lo, hi)]
        if not self.type.variable:
            return f.part(self.key, i, i + 1)[0]
        offsets = f.whole(f"{self.key}.offsets")
        value = f.part(self.key, int(offsets[i]), int(offsets[i + 1]))
        if self.type.base != "str":
            return value
        try:
            return value.tobytes().decode()
        except UnicodeDecodeError as e:
            raise PackError(
                f"{f.path}: column {self.key!r}, row {index}: the stored text is not UTF-8 "
                f"({e}); the pack is corrupt: generate it again"
            ) from None


_REOPEN_LOCK = threading.Lock()  # one thread reopens a closed Pack's files
