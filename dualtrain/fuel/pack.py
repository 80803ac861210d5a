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
import mmap
import os
import threading
import time
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from dualtrain.errors import PackError, bad_argument
from dualtrain.fuel.columns import ColumnType
from dualtrain.fuel.layout import META_KEY, format_of, meta_from_json
from dualtrain.fuel.packcheck import _check_datasets, _check_offsets, _check_set, _layout

__all__ = ["Column", "Pack"]

_Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns
# A read of the mapping is preceded by a check at most this old: the window in which a file
# truncated under a reader can still fault the mapping (SIGBUS), for one stat per ms at most.
_RECHECK_NS = 1_000_000


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _File:
    """One pack file, opened on first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.format = format_of(path, "data_path")
        self._lock = threading.RLock()
        self._handle: Any = None
        self._cache: dict[str, np.ndarray] = {}
        self._sources: dict[str, Any] = {}
        self._checked_ns = 0  # monotonic time of the last check that passed
        if not os.path.isfile(self.path):
            raise bad_argument("data_path", self.path, "an existing pack file")
        self.identity = _identity(os.stat(self.path))
        self.meta, self.datasets = self._read_meta()
        self.check()  # the file did not change while its metadata was read
        _check_datasets(self.path, self.meta, self.datasets)

    def _read_meta(self) -> tuple[dict[str, Any], dict[str, tuple[tuple[int, ...], np.dtype]]]:
        """The metadata and each dataset's (shape, dtype), without reading any data."""
        try:
            if self.format == "hdf5":
                import h5py

                with h5py.File(self.path, "r") as f:
                    text = f.attrs.get(META_KEY)
                    datasets: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
                    f.visititems(
                        lambda name, obj: datasets.__setitem__(name, (obj.shape, obj.dtype))
                        if isinstance(obj, h5py.Dataset) else None
                    )  # fmt: skip
            else:
                text, datasets = _npz_headers(self.path)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise PackError(f"{self.path}: not a readable pack file: {e}") from None
        if text is None:
            raise bad_argument("data_path", self.path, "a pack made by FuelGenerator")
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return meta_from_json(str(text), self.path), datasets

    def check(self) -> None:
        """Raises PackError when the file on disk is no longer the one this Pack opened.

        One `os.stat`: compares device, inode, size and mtime (ns) with those recorded when
        the pack was opened, so truncation, in-place rewrites and replacement by rename are
        caught before the mapping is read.
        """
        try:
            now = _identity(os.stat(self.path))
        except OSError as e:
            raise PackError(f"{self.path}: the pack file is gone ({e.strerror})") from None
        if now != self.identity:
            raise _changed(self.path, self.identity, now)
        self._checked_ns = time.monotonic_ns()

    def guard(self) -> None:
        """`check`, unless a check passed less than a millisecond ago (before each row)."""
        if time.monotonic_ns() - self._checked_ns > _RECHECK_NS:
            self.check()

    def __getstate__(self) -> dict[str, Any]:
        # Handles stay in the process that opened them; a worker opens its own, and checks
        # it against the identity recorded here.
        keep = ("path", "format", "meta", "datasets", "identity")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._handle = None
        self._cache = {}
        self._sources = {}
        self._checked_ns = 0

    def whole(self, name: str) -> np.ndarray:
        """A dataset read whole and cached (offsets; any npz member)."""
        arr = self._cache.get(name)
        if arr is None:
            with self._lock:
                arr = self._cache.get(name)
                if arr is None:
                    arr = np.asarray(self._open()[name][()])
                    if name.endswith((".offsets", ".frames")):
                        _check_offsets(self.path, self.datasets, name, arr)
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
            self._same(os.fstat(f.fileno()))  # the file mapped is the file checked
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        count = int(np.prod(dataset.shape))
        if offset + count * dataset.dtype.itemsize > len(mapped):
            raise PackError(f"{self.path}: dataset {name!r} runs past the end of the file")
        flat = np.frombuffer(mapped, dataset.dtype, count=count, offset=offset)
        return flat.reshape(dataset.shape)

    def _same(self, st: os.stat_result) -> None:
        now = _identity(st)
        if now != self.identity:
            raise _changed(self.path, self.identity, now)

    def _open(self) -> Any:
        if self._handle is None:
            with self._lock:
                if self._handle is None:
                    self.check()
                    if self.format == "hdf5":
                        import h5py

                        handle = h5py.File(self.path, "r")
                        try:
                            self._same(os.fstat(handle.id.get_vfd_handle()))
                        except BaseException:
                            handle.close()
                            raise
                        self._handle = handle
                    else:  # read whole and closed at once: npz members cannot be sliced
                        with open(self.path, "rb") as raw:
                            self._same(os.fstat(raw.fileno()))
                            with np.load(raw, allow_pickle=False) as f:
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


def _changed(path: str, was: _Identity, now: _Identity) -> PackError:
    names = ("device", "inode", "size", "mtime_ns")
    diffs = ", ".join(f"{n} {a} -> {b}" for n, a, b in zip(names, was, now, strict=True) if a != b)
    return PackError(
        f"{path}: the pack file changed since it was opened ({diffs}); a pack must not be "
        "rewritten, truncated or replaced while a Tank or Pack reads it: close() the Tank or "
        "Pack to read the new file, or open it again"
    )


def _npz_headers(path: str) -> tuple[Any, dict[str, tuple[tuple[int, ...], np.dtype]]]:
    """The metadata text and each member's (shape, dtype) of an npz, from the headers only."""
    datasets: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    text = None
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-4]
            with z.open(info) as f:
                if name == META_KEY:
                    text = np.load(f, allow_pickle=False).tobytes()
                    continue
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            datasets[name] = (tuple(shape), np.dtype(dtype))
    return text, datasets


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
        _check_set(self._files)
        first = self._files[0].meta
        # JSON sorts the column dict; "keys" keeps the CSV order.
        self.columns: dict[str, dict[str, Any]] = {k: first["columns"][k] for k in first["keys"]}
        self.image: dict[str, Any] = first.get("image", {})
        self.exif: bool = bool(first.get("exif", False))
        self._column_cache: dict[str, Column] = {}
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

    def locate(self, index: int) -> tuple[_File, int]:
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
            files = [_File(f.path) for f in self._files]
            _check_set(files)
            for old, new in zip(self._files, files, strict=True):
                was, now = _layout(old.meta), _layout(new.meta)
                if was != now:
                    diffs = ", ".join(
                        f"{k} {was[k]!r} -> {now[k]!r}" for k in was if was[k] != now[k]
                    )
                    raise PackError(
                        f"{new.path}: the pack file was replaced by one of another layout "
                        f"while it was closed ({diffs}); open it with a new Tank or Pack"
                    )
            self._files, self._column_cache, self._closed = files, {}, False

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
