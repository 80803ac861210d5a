"""Pack checks: a pack file's datasets and offsets against its metadata, and shards as one pack.

Every dataset the metadata names exists with the shape and dtype it implies, each offsets
array starts at 0, rises, ends at the end of its values and matches its checksum, the
shards of a pack are one `generate` run (every shard once), and a file reopened after
`close` keeps the layout a reader relies on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from dualtrain.errors import PackError
from dualtrain.fuel.columns import ColumnType
from dualtrain.fuel.layout import offsets_checksum

_Datasets = dict[str, tuple[tuple[int, ...], np.dtype]]


class _Shard(Protocol):
    """A pack file as `check_set` sees it: its path and metadata."""

    path: str
    meta: dict[str, Any]


def check_datasets(path: str, meta: dict[str, Any], datasets: _Datasets) -> None:
    """Every dataset the metadata names exists with the shape and dtype it implies."""
    count = meta["count"]
    for key, entry in meta["columns"].items():
        ctype = ColumnType.parse(entry["type"])
        stored = np.dtype(np.uint8) if entry["kind"] != "value" else ctype.dtype
        if not ctype.variable:
            _expect(path, meta, datasets, key, (count, *entry["shape"]), stored)
            continue
        if entry["kind"] == "sequence":
            _expect(path, meta, datasets, f"{key}.frames", (count + 1,), np.dtype(np.int64))
            _expect(path, meta, datasets, f"{key}.offsets", None, np.dtype(np.int64))
        else:
            _expect(path, meta, datasets, f"{key}.offsets", (count + 1,), np.dtype(np.int64))
        _expect(path, meta, datasets, key, None, stored)
    if meta.get("exif"):
        first = meta["keys"][0]
        _expect(path, meta, datasets, f"{first}.exif.offsets", (count + 1,), np.dtype(np.int64))
        _expect(path, meta, datasets, f"{first}.exif", None, np.dtype(np.uint8))


def _expect(
    path: str, meta: dict[str, Any], datasets: _Datasets,
    name: str, shape: tuple[int, ...] | None, dtype: np.dtype,
) -> None:  # fmt: skip
    """Dataset `name` has `shape` (None: any 1-D shape) and `dtype`."""
    found = datasets.get(name)
    if found is None:
        raise PackError(f"{path}: dataset {name!r} is missing")
    got_shape, got_dtype = tuple(found[0]), np.dtype(found[1])
    ok_shape = len(got_shape) == 1 if shape is None else got_shape == shape
    if not ok_shape or got_dtype != dtype:
        want = "1-D" if shape is None else str(shape)
        raise PackError(
            f"{path}: dataset {name!r} has shape {got_shape} and dtype {got_dtype}; "
            f"the metadata implies shape {want} and dtype {dtype} "
            f"(count={meta['count']})"
        )


def check_offsets(
    path: str, datasets: _Datasets, name: str, offsets: np.ndarray,
    checksums: Mapping[str, int] | None = None,
) -> None:  # fmt: skip
    """Offsets start at 0, never decrease and end at the end of the values they index.

    They must also match their checksum in `checksums` (the metadata's), where it has one:
    packs written before checksums have none.
    """
    checksums = checksums or {}
    base, kind = name.rsplit(".", 1)
    if kind == "frames":
        limit = datasets[f"{base}.offsets"][0][0] - 1
    else:
        limit = datasets[base][0][0]
    if offsets.size == 0 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise PackError(f"{path}: dataset {name!r} does not start at 0 and rise")
    if offsets[-1] != limit:
        raise PackError(
            f"{path}: dataset {name!r} ends at {int(offsets[-1])}, but the dataset it indexes "
            f"holds {limit} entries (the last row ends at the last entry)"
        )
    want = checksums.get(name)
    if want is not None and offsets_checksum(offsets) != want:
        raise PackError(
            f"{path}: dataset {name!r} does not match its checksum (CRC-32 "
            f"{offsets_checksum(offsets)}, stored {want}): the pack was changed after it was "
            "written; generate it again"
        )


def layout(meta: dict[str, Any]) -> dict[str, Any]:
    """What a reader relies on: a file replaced by one with the same layout reads on."""
    keys = ("count", "keys", "columns", "image", "exif", "shard", "shards")
    return {k: meta.get(k) for k in keys}


def check_set(files: Sequence[_Shard]) -> None:
    """Raises PackError unless the files are one pack.

    One pack: the same columns and, when the files carry a run id, every shard of one
    `generate` run, once. Packs written before run ids existed have none and are read as they are.
    """
    first = files[0]
    for f in files[1:]:
        if f.meta["columns"] != first.meta["columns"] or f.meta["keys"] != first.meta["keys"]:
            raise PackError(
                f"data_path: shard {f.path!r} has columns {f.meta['columns']}; "
                f"expected those of {first.path!r}: {first.meta['columns']}"
            )
    runs = {f.path: f.meta.get("run") for f in files}
    if not any(runs.values()):
        return
    if len(set(runs.values())) > 1:
        listing = ", ".join(f"{path!r} (run {run})" for path, run in runs.items())
        raise PackError(
            f"data_path: the shards come from different generate runs: {listing}; a crash "
            "between shard renames, or files of two runs under one name, can cause this: "
            "generate the pack again"
        )
    shards = {f.meta.get("shards", 1) for f in files}
    total = max(shards)
    seen: dict[int, list[str]] = {}
    for f in files:
        seen.setdefault(f.meta.get("shard", 0), []).append(f.path)
    duplicate = {i: p for i, p in seen.items() if len(p) > 1}
    missing = sorted(set(range(total)) - set(seen))
    if len(shards) > 1 or duplicate or missing:
        found = ", ".join(
            f"{f.path!r} (shard {f.meta.get('shard', 0)} of {f.meta.get('shards', 1)})"
            for f in files
        )
        problems = [f"shard {i} is missing" for i in missing]
        problems += [f"shard {i} is given {len(p)} times" for i, p in duplicate.items()]
        if len(shards) > 1:
            problems.append(f"the shard counts differ: {sorted(shards)}")
        raise PackError(
            f"data_path: not one whole pack of run {next(iter(runs.values()))}: "
            f"{'; '.join(problems)}; got {found}"
        )
