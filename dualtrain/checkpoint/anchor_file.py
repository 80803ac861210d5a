"""The anchor file: safetensors, a JSON manifest in its header, checksums of every tensor.

Both kinds of anchor (a Craft's, an embedding store's) are written and read here:

- `write_anchor` adds each tensor's CRC-32Cs (one per 32 MiB chunk, `CHUNK`) to the
  manifest and writes the safetensors file itself through `dualtrain.atomic` (a temporary
  name with the writer's pid, fsync, rename, umask permissions); a disk error is raised as
  the `OSError` it is, naming the file;
- `Anchor` opens one private memory mapping of a file and checks its whole structure before
  anything is read: the header length against the file size, the header's JSON, every
  tensor's dtype, shape and byte range (contiguous, each exactly ``prod(shape) * itemsize``
  bytes, together exactly the file's data), and the manifest's JSON. `Anchor.array` checks
  a tensor's checksums before handing it out (CRC-32Cs, or an older format's one zlib
  CRC-32 a tensor). Every problem is a `CheckpointError` naming the file.

The checksums run on every core this process may use, chunk by chunk (CRC-32C in hardware,
about 10 GB/s a core here, the GIL released): writing, they are computed while the data is
written; reading, they are checked over the mapping, which is all the reading there is.

Reading and checking go through the same mapping, so a file renamed over the anchor
meanwhile (another `drop`) cannot mix two files' bytes.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import reprlib
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from dualtrain import atomic, dtypes
from dualtrain.checkpoint.vocabulary import CHUNKED_CRC32C
from dualtrain.errors import ArgumentError, CheckpointError

__all__ = [
    "CHUNK",
    "MAX_HEADER",
    "Anchor",
    "CheckpointError",
    "check_extra",
    "header_length",
    "numpy_scalars",
    "stage_anchor",
    "write_anchor",
]

# safetensors' own limit on the JSON header (its Rust reader's MAX_HEADER_SIZE), enforced by
# `Anchor` and, before anything is written, by the writers (`check_header`): a file one
# writes is one the other reads.
MAX_HEADER = 100_000_000


def numpy_scalars(value: Any) -> Any:
    """Json's `default` for a manifest: a NumPy scalar as its Python value, else TypeError."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


# The header's own CRC-32 (8 hex digits), in its metadata beside the manifest: it covers the
# whole header but itself (every tensor's dtype, shape and offsets, and the manifest), so a
# flipped bit in the manifest (a learning rate, the step, a renamed key) is caught too.
HEADER_CRC = "dualtrain_crc32"

# safetensors' dtype codes and the NumPy dtypes they read as (the one table: dualtrain.dtypes).
_DTYPES: dict[str, np.dtype] = dtypes.BY_CODE


def _contiguous(array: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping the shape (`np.ascontiguousarray` turns a 0-d array into (1,))."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


# The bytes one CRC-32C covers: a tensor's data is checked in chunks of this size, side by
# side on every core (a 400 MB embedding table is one tensor). Fixed by the format (/4).
CHUNK = 1 << 25
# Under this many bytes in all, the checksums run in the calling thread (a pool costs more).
_PARALLEL_BYTES = 1 << 24
# At most this many threads: past it, memory bandwidth, not cores, bounds the checksums.
_MAX_THREADS = 32


def _chunks(buffer: Any) -> list[memoryview]:
    """`buffer` (bytes-like) as its `CHUNK`-byte pieces, the last one shorter (none if empty)."""
    view = memoryview(buffer).cast("B")
    return [view[at : at + CHUNK] for at in range(0, view.nbytes, CHUNK)]


def _workers(nbytes: int, pieces: int) -> int:
    """Threads for checksums of `nbytes` in `pieces`: one when small, else every core (to 32)."""
    if nbytes < _PARALLEL_BYTES or pieces < 2:
        return 1
    return max(1, min(pieces, len(os.sched_getaffinity(0)), _MAX_THREADS))


def _checksums(buffers: Mapping[str, Any], chunked: bool = True) -> dict[str, Any]:
    """Each buffer's CRC-32Cs (a list, one a chunk), or with `chunked` False its zlib CRC-32.

    The zlib CRC-32, one a tensor, is what formats before /4 stored.
    """
    if chunked:
        pieces = [(name, piece) for name, b in buffers.items() for piece in _chunks(b)]
        fn: Callable[[Any], int] = crc32c.crc32c
    else:
        pieces = list(buffers.items())
        fn = zlib.crc32
    nbytes = sum(memoryview(p).nbytes for _, p in pieces)
    workers = _workers(nbytes, len(pieces))
    if workers < 2:
        values = [fn(p) for _, p in pieces]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="dualtrain-crc") as pool:
            values = list(pool.map(fn, (p for _, p in pieces)))
    if not chunked:
        return {name: v for (name, _), v in zip(pieces, values, strict=True)}
    out: dict[str, Any] = {name: [] for name in buffers}
    for (name, _), value in zip(pieces, values, strict=True):
        out[name].append(value)
    return out


def _widest(arrays: Mapping[str, Any]) -> dict[str, list[int]]:
    """The CRC-32C table with the widest values: the room the header reserves for it."""
    return {k: [2**32 - 1] * -(-v.nbytes // CHUNK) for k, v in arrays.items()}


def write_anchor(
    path: Path,
    tensors: dict[str, np.ndarray],
    manifest: dict[str, Any],
    default: Callable[[Any], Any] | None = None,
    replace: bool = True,
) -> None:
    """Writes `tensors` with `manifest` (plus ``crc32c``) to `path`, atomically.

    Args:
        path: the final file.
        tensors: host arrays (views of the caller's tensors: nothing is copied here unless
            an array is not contiguous).
        manifest: JSON data stored under the header's ``dualtrain`` key; a ``crc32c``
            entry ``{name: [CRC-32C of each CHUNK bytes]}`` is added.
        default: `json.dumps`' fallback for values JSON cannot hold.
        replace: replace a file already at `path`; if False, FileExistsError instead.

    Raises:
        FileExistsError: `replace` is False and `path` exists (nothing is left behind).
        OSError: the disk's own error (ENOSPC, EFBIG, EACCES, ...); no temporary file is
            left and `path` is as it was.
    """
    try:
        with atomic.atomic_target(path, replace=replace) as tmp:
            _write(tmp, tensors, manifest, default)
    except OSError as err:
        if err.filename is None:  # name the file the user asked for, not our temporary one
            err.filename = str(path)
        raise


def stage_anchor(
    path: Path,
    tensors: dict[str, np.ndarray],
    manifest: dict[str, Any],
    default: Callable[[Any], Any] | None = None,
) -> Path:
    """Writes the anchor `write_anchor` would write to `path`, but to a temporary file.

    For writers of several anchors that must all appear or none (a BatchModule's members):
    the caller renames the temporary file with ``atomic.commit(tmp, path, replace=False)``
    once every one is written, or removes it with ``atomic.discard``.

    Returns:
        The temporary file (named for `path`, in its folder, swept when its writer is gone).

    Raises:
        OSError: the disk's own error, naming `path`; no temporary file is left.
    """
    tmp = atomic.temp_path(path)
    atomic.sweep_stale(path.parent)
    try:
        _write(tmp, tensors, manifest, default)
    except BaseException as err:
        atomic.discard(tmp)
        if isinstance(err, OSError) and err.filename is None:
            err.filename = str(path)
        raise
    return tmp


def _write(
    tmp: Path,
    tensors: dict[str, np.ndarray],
    manifest: dict[str, Any],
    default: Callable[[Any], Any] | None,
) -> None:
    """The anchor's bytes into `tmp` (see `write_anchor`)."""
    arrays = {k: _little(_contiguous(v)) for k, v in tensors.items()}
    flat = {k: v.reshape(-1).view(np.uint8).data for k, v in arrays.items()}
    # The header holds the CRCs but comes first in the file. Room is reserved for the widest
    # CRCs (which also checks that the manifest is JSON before anything is written), the
    # data is written while a pool computes the CRCs, and the header goes last into its room.
    widest = {**manifest, "crc32c": _widest(arrays)}
    room = len(_header(arrays, {"dualtrain": json.dumps(widest, default=default)}))
    if room - 8 > MAX_HEADER:  # callers check first (`check_header`), naming their argument
        raise ArgumentError(
            f"the anchor's header would be {room - 8:,} bytes, over the {MAX_HEADER:,}-byte "
            f"limit of safetensors readers (TimeMachine.to included); nothing was written"
        )
    # Written here rather than by safetensors.save_file, which writes to a temporary file of
    # its own (``.tmpXXXXXX``, mode 0600) that a killed process leaves behind unrecognised,
    # and reports a full disk as its own error type.
    pieces = {k: _chunks(b) for k, b in flat.items()}
    workers = _workers(sum(a.nbytes for a in arrays.values()), sum(map(len, pieces.values())))
    with (
        open(tmp, "wb") as f,
        ThreadPoolExecutor(workers, thread_name_prefix="dualtrain-crc") as pool,
    ):
        # The checksums run on the pool's threads while this one writes (both release
        # the GIL); with one worker they are taken in the writer's stride instead.
        pending = {k: [pool.submit(crc32c.crc32c, p) for p in v] for k, v in pieces.items()}
        f.seek(room)
        for name in _order(arrays):
            if arrays[name].nbytes:
                f.write(flat[name])
        sums = {k: [c.result() for c in v] for k, v in pending.items()}
        done = {**manifest, "crc32c": sums}
        f.seek(0)
        f.write(_header(arrays, {"dualtrain": json.dumps(done, default=default)}, room))


def header_length(
    tensors: dict[str, np.ndarray],
    manifest: dict[str, Any],
    default: Callable[[Any], Any] | None = None,
) -> int:
    """The header length `write_anchor` would write for `tensors` and `manifest` (its room).

    What `Anchor` compares with `MAX_HEADER`; computed without writing or copying anything.
    """
    arrays = {k: _Shape(v) for k, v in tensors.items()}
    widest = {**manifest, "crc32c": _widest(arrays)}
    return len(_header(arrays, {"dualtrain": json.dumps(widest, default=default)})) - 8


class _Shape:
    """An array's dtype (little-endian), shape and size: all `_header` reads of it."""

    __slots__ = ("dtype", "nbytes", "shape")

    def __init__(self, array: Any) -> None:
        array = array if isinstance(array, np.ndarray) else np.asarray(array)
        self.dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        self.shape, self.nbytes = array.shape, array.nbytes


def check_extra(extra: Any, default: Callable[[Any], Any] | None = None) -> None:
    """Refuses an `extra` that would not load back as it was given (ArgumentError).

    A dict with str keys (at every depth) of what JSON holds: dicts, lists, tuples (loaded
    as lists), str, int, float (NaN and infinities included, as Python's json writes
    them), bool, None, and what `default` turns into those (NumPy scalars). A non-str key
    would silently load as a string (``1`` as ``"1"``), so it is refused, naming where.
    """
    if extra is None:
        return
    if not isinstance(extra, dict):
        raise ArgumentError(
            f"extra must be a dict of JSON-serializable data, or None; got "
            f"{type(extra).__name__} {reprlib.repr(extra)}"
        )
    try:  # first: it also refuses circular references, so the walk below ends
        json.dumps(extra, default=default)
    except (TypeError, ValueError, RecursionError) as err:
        raise ArgumentError(
            f"extra must be JSON-serializable data (dicts with str keys, lists, str, int, "
            f"float, bool, None, NumPy scalars); {type(err).__name__}: {err}"
        ) from err
    pending: list[tuple[str, Any]] = [("extra", extra)]
    while pending:  # iterative: as deep as json.dumps goes
        where, value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ArgumentError(
                        f"{where} has the key {key!r} ({type(key).__name__}): JSON keys are "
                        f"strings, so it would load back as {json.dumps(key, default=default)!r}"
                        f"; use str keys"
                    )
                pending.append((f"{where}[{key!r}]", item))
        elif isinstance(value, (list, tuple)):
            pending.extend((f"{where}[{i}]", item) for i, item in enumerate(value))


def check_header(
    tensors: dict[str, np.ndarray],
    manifest: dict[str, Any],
    default: Callable[[Any], Any] | None = None,
    extra: Any = None,
) -> None:
    """Refuses (ArgumentError) an anchor whose header `Anchor` would refuse as too long.

    The message names `extra` with its JSON size when it takes the bulk of the header, else
    the tensors (their count).
    """
    length = header_length(tensors, manifest, default)
    if length <= MAX_HEADER:
        return
    extra_bytes = len(json.dumps(extra or {}, default=default))
    limit = (
        f"over the {MAX_HEADER:,}-byte limit on a safetensors header (safetensors' readers "
        f"and TimeMachine.to refuse longer ones)"
    )
    if extra_bytes * 2 > length:
        raise ArgumentError(
            f"extra is {extra_bytes:,} bytes of JSON: the anchor's header would be "
            f"{length:,} bytes, {limit}; store large data in a file of its own"
        )
    raise ArgumentError(
        f"the anchor's header would be {length:,} bytes for {len(tensors):,} tensors "
        f"(extra: {extra_bytes:,} bytes), {limit}"
    )


def _little(array: np.ndarray) -> np.ndarray:
    if array.dtype.byteorder == ">":
        return array.astype(array.dtype.newbyteorder("<"))
    return array


def _order(arrays: Mapping[str, Any]) -> list[str]:
    """Safetensors' order: widest dtype first (keeps every tensor aligned), then by name."""
    return sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k))


def _header(arrays: Mapping[str, Any], metadata: dict[str, str], size: int = 0) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file, padded to 8 bytes.

    With `size`, padded with spaces to exactly `size` bytes (the room reserved for it).
    """
    entries: dict[str, Any] = {"__metadata__": metadata}
    at = 0
    for name in _order(arrays):
        array = arrays[name]
        code = dtypes.code_of(array.dtype)
        if code is None:
            raise TypeError(f"{name} has dtype {array.dtype}, which safetensors cannot store")
        entries[name] = {
            "dtype": code,
            "shape": list(array.shape),
            "data_offsets": [at, at + array.nbytes],
        }
        at += array.nbytes
    # The CRC's room is the same whatever its value, so the room reserved before is exact.
    metadata[HEADER_CRC] = f"{_header_crc(entries):08x}"
    text = json.dumps(entries, separators=(",", ":")).encode()
    if size and len(text) > size - 8:  # it would run into the data written after its room
        raise RuntimeError(
            f"dualtrain bug: an anchor's header needs {len(text)} bytes, {size - 8} reserved"
        )
    text += b" " * ((size - 8 - len(text)) if size else (-len(text) % 8))
    return len(text).to_bytes(8, "little") + text


def _header_crc(header: dict[str, Any]) -> int:
    """CRC-32 of `header` (parsed or about to be written) without its own CRC entry.

    Computed on the compact JSON of the parsed header, which is the text the writer wrote:
    a change of any value changes it.
    """
    metadata = header.get("__metadata__")
    if isinstance(metadata, dict):
        rest = {k: v for k, v in metadata.items() if k != HEADER_CRC}
        header = {k: (rest if k == "__metadata__" else v) for k, v in header.items()}
    return zlib.crc32(json.dumps(header, separators=(",", ":")).encode())


class _Entry:
    """One tensor of the header: dtype, shape and absolute byte range in the file."""

    __slots__ = ("begin", "dtype", "end", "shape")

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...], begin: int, end: int) -> None:
        self.dtype, self.shape, self.begin, self.end = dtype, shape, begin, end


def _nonneg_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Anchor:
    """An anchor file, mapped privately and checked whole (see the module's docstring).

    Attributes:
        path: the file.
        entries: ``{name: entry}`` with ``.dtype`` (NumPy), ``.shape``, ``.begin``, ``.end``.
        metadata: the header's ``__metadata__`` (str -> str).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 8:
                    raise self.error(
                        f"is not a safetensors file: {size} bytes, fewer than the 8-byte "
                        f"header length"
                    )
                # A private mapping: arrays over it are writable (torch wants that) and
                # writing them never reaches the file.
                self._map = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        except OSError as err:
            raise self.error(f"cannot be read: {err}") from err
        self.size = size
        self._verified: set[str] = set()
        self._crcs: Any = None  # read by `manifest`
        self._chunked = True
        self.entries, self.metadata = self._parse()

    def error(self, what: str) -> CheckpointError:
        """A CheckpointError about this file: ``<path> <what>``."""
        return CheckpointError(f"{self.path} {what}")

    def _parse(self) -> tuple[dict[str, _Entry], dict[str, str]]:
        n = int.from_bytes(self._map[:8], "little")
        if n > self.size - 8:
            raise self.error(
                f"is not a safetensors file (or is truncated): its header length {n:,} "
                f"exceeds the {self.size - 8:,} bytes that follow"
            )
        if n > MAX_HEADER:
            raise self.error(
                f"has a header of {n:,} bytes, over the {MAX_HEADER:,}-byte limit on a "
                f"safetensors header (TimeMachine.drop refuses to write one)"
            )
        try:
            header = json.loads(bytes(self._map[8 : 8 + n]))
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
            raise self.error(f"is not a safetensors file: its header is not JSON ({err})") from err
        if not isinstance(header, dict):
            raise self.error("is not a safetensors file: its header is not a JSON object")
        raw = header.get("__metadata__")
        stored_crc = raw.get(HEADER_CRC) if isinstance(raw, dict) else None
        self.header_crc = stored_crc is not None
        if stored_crc is not None and stored_crc != f"{_header_crc(header):08x}":
            raise self.error("is corrupt: its header (manifest included) fails its CRC-32 check")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self.error("has a malformed __metadata__: not an object of strings")
        start = 8 + n
        entries: dict[str, _Entry] = {}
        for name, spec in header.items():
            entries[name] = self._entry(name, spec, start)
        spans = sorted((e.begin, e.end, name) for name, e in entries.items())
        at = start
        for begin, end, name in spans:
            if begin != at:
                raise self.error(
                    f"is corrupt: tensor {name!r} starts at byte {begin - start} of the data, "
                    f"expected {at - start} (tensors must be contiguous)"
                )
            at = end
        if at != self.size:
            raise self.error(
                f"is truncated or has trailing bytes: its tensors need {at - start} bytes of "
                f"data, the file holds {self.size - start}"
            )
        return entries, dict(metadata)

    def _entry(self, name: str, spec: Any, start: int) -> _Entry:
        if not isinstance(spec, dict):
            raise self.error(f"has a malformed header entry for {name!r}: not an object")
        code, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if not isinstance(code, str) or code not in _DTYPES:
            raise self.error(f"has tensor {name!r} of unknown dtype {code!r}")
        if not isinstance(shape, list) or not all(_nonneg_int(d) for d in shape):
            raise self.error(f"has tensor {name!r} with a malformed shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_nonneg_int(o) for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise self.error(f"has tensor {name!r} with malformed data_offsets {offsets!r}")
        dtype = _DTYPES[code]
        nbytes = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise self.error(
                f"is corrupt: tensor {name!r} {tuple(shape)} {dtype.name} needs {nbytes} bytes, "
                f"its header gives it {offsets[1] - offsets[0]}"
            )
        return _Entry(dtype, tuple(shape), start + offsets[0], start + offsets[1])

    def manifest(
        self,
        expected: str,
        legacy: tuple[str, ...] = (),
        older: tuple[str, ...] = (),
        chunked: frozenset[str] = CHUNKED_CRC32C,
    ) -> dict[str, Any]:
        """The JSON manifest, checked to be an object of format `expected` (or an older one).

        An anchor of format `expected`, or of an `older` format, must carry the header's
        CRC-32 and the tensors' checksums: CRC-32Cs by chunk (``crc32c``) in a format of
        `chunked`, else one CRC-32 a tensor (``crc32``); one of a `legacy` format (written
        before them) is read without them. The manifest is returned as stored (see
        ``checkpoint.vocabulary.upgrade`` for its words in this version's vocabulary).
        """
        if "dualtrain" not in self.metadata:
            raise self.error("is a safetensors file but not a dualtrain checkpoint")
        try:
            manifest = json.loads(self.metadata["dualtrain"])
        except ValueError as err:
            raise self.error(f"has a manifest that is not valid JSON ({err})") from err
        if not isinstance(manifest, dict):
            raise self.error("has a manifest that is not a JSON object")
        found = manifest.get("format")
        if found not in (expected, *older, *legacy):
            reads = ", ".join(repr(f) for f in (expected, *older, *legacy))
            raise self.error(f"has format {found!r}; this reads {reads}")
        self._chunked = found in chunked
        table = "crc32c" if self._chunked else "crc32"
        crcs = manifest.get(table)
        if found in (expected, *older) and (not self.header_crc or crcs is None):
            lacks = "its header's CRC-32" if not self.header_crc else f"its tensors' {table}"
            raise self.error(f"is corrupt: format {found!r} but {lacks} ({HEADER_CRC}, {table})")
        if crcs is not None and not (
            isinstance(crcs, dict)
            and set(crcs) == set(self.entries)
            and all(self._well_formed(name, v) for name, v in crcs.items())
        ):
            what = "a list of CRC-32Cs, one per 32 MiB chunk" if self._chunked else "one CRC-32"
            raise self.error(f"has a malformed {table} table: {what} per tensor expected")
        self._crcs = crcs
        return manifest

    def _well_formed(self, name: str, value: Any) -> bool:
        """Whether `value` is tensor `name`'s checksum entry in this anchor's format."""
        if not self._chunked:
            return _nonneg_int(value) and value < 2**32
        entry = self.entries[name]
        return (
            isinstance(value, list)
            and len(value) == -(-(entry.end - entry.begin) // CHUNK)
            and all(_nonneg_int(v) and v < 2**32 for v in value)
        )

    def verify(self, names: Any = None) -> None:
        """Checks the checksums of tensors `names` (default: every tensor) against the manifest.

        Call `manifest` first: it reads the checksum table (anchors without one have none to
        check). Each tensor is checked once; `array` skips those already checked. The chunks
        of every tensor asked for are checked side by side, on every core.
        """
        crcs = self._crcs
        pending = {}
        for name in self.entries if names is None else names:
            entry = self.entries.get(name)
            if entry is None:
                raise self.error(f"has no tensor {name!r}")
            if crcs is not None and name not in self._verified:
                pending[name] = memoryview(self._map)[entry.begin : entry.end]
        found = _checksums(pending, chunked=self._chunked)
        kind = "CRC-32C" if self._chunked else "CRC-32"
        for name in pending:  # in the caller's order, so the error names the first bad one
            if found[name] != crcs[name]:
                raise self.error(f"is corrupt: tensor {name!r} fails its {kind} check")
            self._verified.add(name)

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` as a NumPy array over the mapping, its CRC-32 checked (see `verify`)."""
        self.verify([name])
        entry = self.entries[name]
        view = memoryview(self._map)[entry.begin : entry.end]
        array = np.frombuffer(view, entry.dtype).reshape(entry.shape)
        if entry.begin % max(entry.dtype.alignment, 1):  # safetensors pads only the header
            array = array.copy()
        return array
