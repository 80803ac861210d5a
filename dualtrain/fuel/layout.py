"""The pack format: which datasets a pack file holds, and its metadata.

A pack is one HDF5 (``.h5``/``.hdf5``) or ``.npz`` file, or k shards of one, with the same
dataset names in both formats:

- a fixed column ``key``: one array of shape ``(n, *cell_shape)``;
- a variable-length column (``v`` types, ``str``, encoded images): ``key`` holds the values
  of all rows end to end and ``key.offsets`` (int64, n + 1) where each row starts;
- a sequence column (``is_seq``): ``key`` and ``key.offsets`` per frame, and ``key.frames``
  (int64, n + 1) where each row's frames start;
- EXIF blocks of an image column: ``key.exif`` and ``key.exif.offsets``;
- ``__fuel__``: the metadata, JSON (an HDF5 attribute, or a uint8 array in npz). Its
  ``checksums`` maps each ``.offsets`` and ``.frames`` dataset to the CRC-32 of its
  little-endian int64 bytes (`offsets_checksum`); packs written before it have none.
"""

from __future__ import annotations

import json
import string
import zlib
from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError, PackError, bad_argument

__all__ = [
    "FORMAT", "META_KEY", "VERSION", "format_of", "meta_from_json", "meta_to_json",
    "offsets_checksum",
]  # fmt: skip

FORMAT = "dualtrain.fuel"
VERSION = 1
META_KEY = "__fuel__"
_SUFFIXES = {".h5": "hdf5", ".hdf5": "hdf5", ".npz": "npz"}


def format_of(path: str, argument: str = "dst_path") -> str:
    """``"hdf5"`` or ``"npz"`` from the file name's extension."""
    for suffix, fmt in _SUFFIXES.items():
        if str(path).lower().endswith(suffix):
            return fmt
    raise bad_argument(argument, str(path), "a path ending in .h5, .hdf5 or .npz")


def offsets_checksum(offsets: np.ndarray) -> int:
    """The CRC-32 of an offsets array's values, as little-endian int64 bytes."""
    return zlib.crc32(np.ascontiguousarray(offsets, dtype="<i8").tobytes())


def meta_to_json(meta: dict[str, Any]) -> str:
    """The metadata as the JSON text stored in the file."""
    return json.dumps({"format": FORMAT, "version": VERSION, **meta}, sort_keys=True)


def meta_from_json(text: str, path: str) -> dict[str, Any]:
    """Parses and checks stored metadata; `path` names the file in errors.

    Raises:
        ArgumentError: the file is not a dualtrain.fuel pack.
        PackError: the metadata is malformed (bad JSON, missing or ill-typed keys, negative
            counts, column entries that do not parse); the message names the file.
    """
    try:
        meta = json.loads(text)
    except (ValueError, TypeError) as e:  # JSONDecodeError, bad UTF-8
        raise PackError(f"{path}: the pack metadata ({META_KEY}) is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise PackError(
            f"{path}: the pack metadata ({META_KEY}) is a JSON {type(meta).__name__}, not an object"
        )
    if meta.get("format") != FORMAT:
        raise bad_argument(
            "data_path", path, f"a {FORMAT} pack of version {VERSION} (made by FuelGenerator)"
        )
    if meta.get("version") != VERSION:
        raise PackError(
            f"{path}: pack version {meta.get('version')!r}; this dualtrain reads version {VERSION}"
        )
    _check_meta(meta, path)
    return meta


def _meta_error(path: str, key: str, value: Any, expected: str) -> PackError:
    return PackError(
        f"{path}: malformed pack metadata: {key!r} must be {expected}; got {value!r}"[:1000]
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_meta(meta: dict[str, Any], path: str) -> None:
    """The keys Pack relies on, with their types; raises PackError naming `path`."""
    from dualtrain.fuel.columns import ColumnType

    if not _count(meta.get("count")):
        raise _meta_error(path, "count", meta.get("count"), "a non-negative int")
    keys = meta.get("keys")
    if (
        not isinstance(keys, list)
        or not keys
        or not all(isinstance(k, str) and k for k in keys)
        or len(set(keys)) != len(keys)
    ):
        raise _meta_error(path, "keys", keys, "a non-empty list of distinct column names")
    columns = meta.get("columns")
    if not isinstance(columns, dict) or set(columns) != set(keys):
        raise _meta_error(path, "columns", columns, f"a dict with one entry per key of {keys}")
    for position, key in enumerate(keys):
        entry = columns[key]
        where = f"columns[{key!r}]"
        if not isinstance(entry, dict):
            raise _meta_error(path, where, entry, "a dict with 'type' and 'kind'")
        try:
            ctype = ColumnType.parse(entry.get("type"), f"{where}['type']")
        except ArgumentError as e:
            raise PackError(f"{path}: malformed pack metadata: {e}") from None
        kind = entry.get("kind")
        if kind not in ("value", "image", "sequence"):
            raise _meta_error(path, f"{where}['kind']", kind, "'value', 'image' or 'sequence'")
        if kind != "value" and (position != 0 or not ctype.variable):
            raise _meta_error(
                path, f"{where}['kind']", kind, "'value' (only the first column holds images)"
            )
        if not ctype.variable:
            shape = entry.get("shape")
            if not isinstance(shape, list) or not all(_count(s) for s in shape):
                raise _meta_error(path, f"{where}['shape']", shape, "a list of ints >= 0")
    for key, kind in (("image", dict), ("exif", bool)):
        if key in meta and not isinstance(meta[key], kind):
            raise _meta_error(path, key, meta[key], f"a {kind.__name__}")
    if "image" in meta:
        _check_image_meta(meta["image"], path)
    shard, shards = meta.get("shard", 0), meta.get("shards", 1)
    if not _count(shards) or shards < 1 or not _count(shard) or shard >= shards:
        raise _meta_error(path, "shard", (shard, shards), "0 <= shard < shards")
    checksums = meta.get("checksums", {})  # packs written before checksums have none
    if not isinstance(checksums, dict) or not all(
        isinstance(k, str) and k.endswith((".offsets", ".frames")) and _count(v) and v < 2**32
        for k, v in checksums.items()
    ):
        raise _meta_error(
            path, "checksums", checksums, "a dict of offsets dataset -> CRC-32 (an int < 2**32)"
        )
    run = meta.get("run")
    if run is not None and not (
        isinstance(run, str) and len(run) == 32 and all(c in string.hexdigits for c in run)
    ):
        raise _meta_error(path, "run", run, "a str of 32 hex digits")


def _check_image_meta(image: dict[str, Any], path: str) -> None:
    """The stored image settings: the sizes, channels, encoding and depth `generate` writes."""
    from dualtrain.fuel import images

    for key in ("height", "width"):
        value = image.get(key)
        if not _count(value) or value == 0:
            raise _meta_error(path, f"image[{key!r}]", value, "a positive int")
    channel = image.get("channel")
    if not _count(channel) or channel not in images.MODES:
        raise _meta_error(path, "image['channel']", channel, "1, 3 or 4")
    if image.get("encode") not in images.ENCODINGS:
        raise _meta_error(
            path, "image['encode']", image.get("encode"), f"one of {images.ENCODINGS}"
        )
    depth = image.get("dtype", "uint8")  # packs written before depths hold uint8
    if not isinstance(depth, str) or depth not in images.DEPTHS:
        raise _meta_error(path, "image['dtype']", depth, f"one of {images.DEPTHS}")
    if depth != "uint8" and channel != 1:
        raise _meta_error(path, "image['channel']", channel, f"1 for image['dtype']={depth!r}")
