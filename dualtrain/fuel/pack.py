"""Pack: reads a pack (one file or its shards) row by row.

Files are opened lazily, on the first read in each process, and the open handles are not
pickled, so a Pack can be handed to worker processes (each opens its own handles, which h5py
needs). Contiguous HDF5 datasets (FuelGenerator writes no other kind) are mapped into memory,
so a row is a slice of the page cache: no h5py call, no lock, no GIL held. Offsets are read
once per file and kept. npz
files are read whole on first use (npz members cannot be sliced on disk): npz suits packs
that fit in memory, HDF5 any size.
"""

from __future__ import annotations

import bisect
import mmap
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.fuel.columns import ColumnType
from dualtrain.fuel.layout import META_KEY, format_of, meta_from_json

__all__ = ["Column", "Pack"]


class _File:
    """One pack file, opened on first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.format = format_of(path, "data_path")
        self._lock = threading.RLock()
        self._handle: Any = None
        self._cache: dict[str, np.ndarray] = {}
        self._sources: dict[str, Any] = {}
        self.meta = self._read_meta()

    def _read_meta(self) -> dict[str, Any]:
        if not os.path.isfile(self.path):
            raise bad_argument("data_path", self.path, "an existing pack file")
        if self.format == "hdf5":
            import h5py

            with h5py.File(self.path, "r") as f:
                text = f.attrs.get(META_KEY)
        else:
            with np.load(self.path, allow_pickle=False) as f:
                text = bytes(f[META_KEY]).decode() if META_KEY in f.files else None
        if text is None:
            raise bad_argument("data_path", self.path, "a pack made by FuelGenerator")
        return meta_from_json(str(text), self.path)

    def __getstate__(self) -> dict[str, Any]:
        # Handles stay in the process that opened them; a worker opens its own.
        return {"path": self.path, "format": self.format, "meta": self.meta}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._handle = None
        self._cache = {}
        self._sources = {}

    def whole(self, name: str) -> np.ndarray:
        """A dataset read whole and cached (offsets; any npz member)."""
        arr = self._cache.get(name)
        if arr is None:
            with self._lock:
                arr = self._cache.get(name)
                if arr is None:
                    arr = np.asarray(self._open()[name][()])
                    self._cache[name] = arr
        return arr

    def part(self, name: str, start: int, stop: int) -> np.ndarray:
        """``dataset[start:stop]``, without a copy where the dataset is mapped."""
        if self.format == "npz":
            return self.whole(name)[start:stop]
        source = self._sources.get(name)
        if source is None:
            source = self._sources[name] = self._source(name)
        return source[start:stop]

    def _source(self, name: str) -> Any:
        """A read-only array mapped over a contiguous dataset, else the h5py dataset."""
        dataset = self._open()[name]
        offset = dataset.id.get_offset()
        if dataset.chunks is not None or dataset.compression is not None or offset is None:
            return dataset
        with open(self.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        count = int(np.prod(dataset.shape))
        flat = np.frombuffer(mapped, dataset.dtype, count=count, offset=offset)
        return flat.reshape(dataset.shape)

    def _open(self) -> Any:
        if self._handle is None:
            with self._lock:
                if self._handle is None:
                    if self.format == "hdf5":
                        import h5py

                        self._handle = h5py.File(self.path, "r")
                    else:  # read whole and closed at once: npz members cannot be sliced
                        with np.load(self.path, allow_pickle=False) as f:
                            self._handle = {name: f[name] for name in f.files}
        return self._handle

    def close(self) -> None:
        """Closes the file handle (a later read opens it again)."""
        with self._lock:
            if self._handle is not None and self.format == "hdf5":
                self._handle.close()
            self._handle = None
            self._cache = {}
            self._sources = {}


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
        self._files = [_File(os.fspath(p)) for p in paths]
        first = self._files[0].meta
        for f in self._files[1:]:
            if f.meta["columns"] != first["columns"]:
                raise ArgumentError(
                    f"data_path: shard {f.path!r} has columns {f.meta['columns']}; "
                    f"expected those of {self._files[0].path!r}: {first['columns']}"
                )
        # JSON sorts the column dict; "keys" keeps the CSV order.
        self.columns: dict[str, dict[str, Any]] = {k: first["columns"][k] for k in first["keys"]}
        self.image: dict[str, Any] = first.get("image", {})
        self.exif: bool = bool(first.get("exif", False))
        self._column_cache: dict[str, Column] = {}
        self._starts = np.cumsum([0] + [f.meta["count"] for f in self._files]).tolist()

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def keys(self) -> list[str]:
        """The column keys, in CSV order."""
        return list(self.columns)

    def locate(self, index: int) -> tuple[_File, int]:
        """The file holding row `index` and the row's index inside it."""
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
        """Closes every open file (a later read opens it again)."""
        for f in self._files:
            f.close()

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

    def __getitem__(self, index: int) -> Any:
        f, i = self.pack.locate(int(index))
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
        return value.tobytes().decode() if self.type.base == "str" else value
