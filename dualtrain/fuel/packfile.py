"""PackFile: one file of a pack, opened lazily in each process and checked before reads.

Contiguous HDF5 datasets are mapped into memory; npz files are read whole on first use.
The file's identity (device, inode, size, mtime) is recorded when it is opened, and
`PackFile.check` compares it with the file on disk, so a file truncated, rewritten or
replaced under a reader is a PackError, not a SIGBUS of the mapping. `dualtrain.fuel.pack`
indexes a pack's rows across its files.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
import zipfile
from typing import Any

import numpy as np

from dualtrain.errors import PackError, bad_argument
from dualtrain.fuel.layout import META_KEY, format_of, meta_from_json
from dualtrain.fuel.packcheck import check_datasets, check_offsets

__all__ = ["PackFile"]

_Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns
# A read of the mapping is preceded by a check at most this old: the window in which a file
# truncated under a reader can still fault the mapping (SIGBUS), for one stat per ms at most.
_RECHECK_NS = 1_000_000


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class PackFile:
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
        check_datasets(self.path, self.meta, self.datasets)

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
                        check_offsets(
                            self.path, self.datasets, name, arr, self.meta.get("checksums")
                        )
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

    def take(self, name: str, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``dataset[rows]`` for an int64 index array already checked to lie in range.

        One gather over the mapping (or the npz member); an h5py dataset that is not mapped
        (chunked or compressed) is read once at the sorted distinct rows, as h5py requires.
        `out`, when given, receives the rows (same dtype and shape) and is returned.
        """
        if self.format == "npz":
            source: Any = self.whole(name)
        else:
            source = self._sources.get(name)
            if source is None:
                source = self._sources[name] = self._source(name)
        if isinstance(source, np.ndarray):
            # mode="clip": the rows are in range, and "raise" would buffer `out` once more.
            return source.take(rows, axis=0, out=out, mode="clip")
        distinct, where = np.unique(rows, return_inverse=True)
        values = np.asarray(source[distinct]) if len(distinct) else np.empty(
            (0, *source.shape[1:]), source.dtype
        )  # fmt: skip
        return values.take(where, axis=0, out=out, mode="clip")

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
