"""The pack format: which datasets a pack file holds, and its metadata.

A pack is one HDF5 (``.h5``/``.hdf5``) or ``.npz`` file, or k shards of one, with the same
dataset names in both formats:

- a fixed column ``key``: one array of shape ``(n, *cell_shape)``;
- a variable-length column (``v`` types, ``str``, encoded images): ``key`` holds the values
  of all rows end to end and ``key.offsets`` (int64, n + 1) where each row starts;
- a sequence column (``is_seq``): ``key`` and ``key.offsets`` per frame, and ``key.frames``
  (int64, n + 1) where each row's frames start;
- EXIF blocks of an image column: ``key.exif`` and ``key.exif.offsets``;
- ``__fuel__``: the metadata, JSON (an HDF5 attribute, or a uint8 array in npz).
"""

from __future__ import annotations

import json
from typing import Any

from dualtrain.errors import bad_argument

__all__ = ["FORMAT", "META_KEY", "VERSION", "format_of", "meta_from_json", "meta_to_json"]

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


def meta_to_json(meta: dict[str, Any]) -> str:
    """The metadata as the JSON text stored in the file."""
    return json.dumps({"format": FORMAT, "version": VERSION, **meta}, sort_keys=True)


def meta_from_json(text: str, path: str) -> dict[str, Any]:
    """Parses and checks stored metadata; `path` names the file in errors."""
    meta = json.loads(text)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise bad_argument(
            "data_path", path, f"a {FORMAT} pack of version {VERSION} (made by FuelGenerator)"
        )
    return meta
