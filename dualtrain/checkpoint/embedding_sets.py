"""A sharded EmbeddingStore's anchor: one part file a process, and a manifest that commits them.

A store sharded by ``mv.sync(store)`` is written by every process of the run at once
(`save_set`, a collective over the store's `Exchange`), into one folder (across hosts, on a
file system they share). For an anchor named ``emb.safetensors``:

- each rank writes its range of rows (table, optimizer state, exact mode's counters, in
  chunks of ``CHUNK`` rows counted from the range's first id) as a part file
  ``emb%r<rank>of<world>.<set>.safetensors`` (format `EMBEDDINGS_PART_FORMAT`; ``<set>`` is
  8 hex digits drawn for this write), to a temporary name and renamed;
- once every part is in place (a collective), rank 0 writes ``emb.safetensors`` itself last,
  also by temporary name and rename: a safetensors file with no tensors whose manifest
  (`EMBEDDINGS_SET_FORMAT`) holds what a single-file anchor's does (shape, dtype, slots,
  mode, step, optimizer, hyper, extra) and names every part: its file, its ids
  ``[start, stop)``, its size in bytes and its header's CRC-32 (which covers the part's own
  CRC-32Cs of every tensor, so the set pins every byte of its parts).

The manifest commits the set. A new set never overwrites an older set's parts (its ``<set>``
differs), so until the new manifest replaces the old one the old set loads whole; after it,
rank 0 deletes the parts of that name no manifest names (an older set's, or a killed write's).
Parts without a manifest never load: `to_embeddings` names them as an unfinished write. Every
step's outcome is gathered over the exchange, so an error on one rank is raised on every
rank (naming the rank) instead of leaving the others waiting; a failed write removes the
parts it had put in place.

`load_any` loads a set or a single-file anchor into a store of any world size: each rank
checks the manifest, then only the parts and chunks that overlap its own ids (`pieces`), and
reads only those (``Anchor`` maps a file and reads the pages it is asked for; every chunk read
is CRC-checked first). Sharded, the ranks agree that every one of them can load before any
writes a row: a load changes every rank's rows or none.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dualtrain import atomic, dtypes
from dualtrain.checkpoint.anchor_file import (
    HEADER_CRC,
    Anchor,
    check_extra,
    check_header,
    numpy_scalars,
    stage_anchor,
    write_anchor,
)
from dualtrain.checkpoint.anchor_names import SUFFIX
from dualtrain.checkpoint.embeddings import (
    CHUNK,
    backend_of,
    check_chunks,
    check_fit,
    checked_manifest,
    load_rows,
    optimizer_name,
    session_of,
    write_loaded,
)
from dualtrain.checkpoint.vocabulary import EMBEDDINGS_PART_FORMAT, EMBEDDINGS_SET_FORMAT
from dualtrain.errors import CheckpointError

__all__ = [
    "PART_FORMAT",
    "SET_FORMAT",
    "Piece",
    "drop_parts",
    "gather",
    "load_any",
    "part_files",
    "part_name",
    "pieces",
    "save_set",
    "unfinished",
]

SET_FORMAT = EMBEDDINGS_SET_FORMAT
PART_FORMAT = EMBEDDINGS_PART_FORMAT
# What a part adds to the set's name: ``%r<rank>of<world>.<set>``. A scope's stem writes
# every ``%`` as ``%XX`` (`anchor_names.anchor_stem`) and numbered names end ``-<n>``, so
# parts never meet numbering, retention or member series.
_PART = r"%r(0|[1-9][0-9]*)of([1-9][0-9]*)\.([0-9a-f]{8})"


def _stem(path: Path) -> str:
    return path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name


def part_name(path: Path, rank: int, world: int, token: str) -> str:
    """The file name of rank `rank`'s part of set `token` for the anchor at `path`."""
    return f"{_stem(path)}%r{rank}of{world}.{token}{SUFFIX}"


def part_files(path: Path) -> list[Path]:
    """The part files beside `path` of any set of its name (committed or not), sorted."""
    form = re.compile(re.escape(_stem(path)) + _PART + re.escape(SUFFIX))
    try:
        names = [p for p in path.parent.iterdir() if form.fullmatch(p.name)]
    except OSError:
        return []
    return sorted(names)


def unfinished(path: Path) -> CheckpointError | None:
    """The error for a missing anchor `path` that has parts beside it (a write cut short)."""
    parts = part_files(path)
    if not parts:
        return None
    return CheckpointError(
        f"no checkpoint at {path}: {len(parts)} part file(s) of a sharded embedding anchor "
        f"are there ({parts[0].name}, ...) but not the manifest that commits them, so the "
        f"write that made them did not finish; drop the store again (the next write removes "
        f"them)"
    )


class Piece(NamedTuple):
    """One chunk's rows a reader needs: chunk `chunk`'s rows ``[begin, end)`` go to `at`.

    `begin` and `end` count from the chunk's first row; `at` from the reader's first id.
    """

    chunk: int
    begin: int
    end: int
    at: int


def pieces(start: int, stop: int, chunk: int, lo: int, hi: int) -> list[Piece]:
    """The chunks of ids ``[start, stop)`` (cut every `chunk` rows) that hold ids ``[lo, hi)``.

    In order; together they hold exactly the ids both ranges share (none if they do not meet).
    """
    first, last = max(start, lo), min(stop, hi)
    out = []
    if first < last:
        for i in range((first - start) // chunk, (last - 1 - start) // chunk + 1):
            begin = start + i * chunk
            a, b = max(begin, first), min(begin + chunk, stop, last)
            out.append(Piece(i, a - begin, b - begin, a - lo))
    return out


def gather(exchange: Any, value: Any) -> list[Any]:
    """Every rank's `value` (JSON data), by rank: a collective over `exchange`."""
    data = np.frombuffer(json.dumps(value).encode(), np.uint8).copy()
    return [json.loads(bytes(got)) for got in exchange.all_to_all([data] * exchange.world)]


def _agree(exchange: Any, error: BaseException | None, what: str, value: Any = None) -> list[Any]:
    """Every rank's `value` once every rank got here without an error; else raises everywhere.

    A collective: the rank that failed raises its own error, the others a CheckpointError
    naming it.
    """
    text = None if error is None else f"{type(error).__name__}: {error}"
    every = gather(exchange, {"error": text, "value": value})
    if error is not None:
        raise error
    for rank, outcome in enumerate(every):
        if outcome["error"] is not None:
            raise CheckpointError(f"rank {rank} failed to {what}: {outcome['error']}")
    return [outcome["value"] for outcome in every]


def _chunks(name: str, table: np.ndarray, chunk: int) -> dict[str, np.ndarray]:
    return {f"{name}.{i // chunk}": table[i : i + chunk] for i in range(0, len(table), chunk)}


def _remove(*paths: Path | None) -> None:
    """Removes what a failed write left (best effort: the write's own error is raised)."""
    for path in paths:
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def save_set(
    rows: Any, path: Path, extra: dict[str, Any] | None = None, chunk: int = CHUNK
) -> Path:
    """Writes a sharded store as a set (see the module's docstring): a collective.

    Every rank of the store's shard calls it with the same `path` and `extra`. `chunk` is
    the rows a tensor (the format records it; smaller in tests).

    Returns:
        `path`, the set's manifest.

    Raises:
        On every rank, the first rank's error (its own on the rank that failed).
    """
    session = session_of(rows)
    store = rows.store
    shard = store.shard
    exchange, rank, world = shard.exchange, shard.rank, shard.world
    error: BaseException | None = None
    try:
        check_extra(extra, numpy_scalars)
    except Exception as err:
        error = err
    # Rank 0's token names the set; every rank must be writing to the same file (a relative
    # name resolved from different working directories would scatter the parts).
    agreed = _agree(
        exchange, error, "write the embedding anchor", [secrets.token_hex(4), str(path.resolve())]
    )
    token = agreed[0][0]
    paths = sorted({where for _, where in agreed})
    if len(paths) > 1:
        raise CheckpointError(
            f"the ranks write the embedding anchor to different files {paths}: pass every rank "
            "the same absolute path (across hosts, on a file system they share)"
        )
    final = path.with_name(part_name(path, rank, world, token))
    tmp: Path | None = None
    record = None
    try:
        with session.owned():  # no step of another thread changes rows while they are written
            session.flush()
            table, state, counters = store.live()
            tensors = _chunks("weight", table, chunk)
            for slot, values in state.items():
                tensors.update(_chunks(f"state.{slot}", values, chunk))
            if counters is not None:
                tensors.update(_chunks("counters", counters, chunk))
            manifest = {
                **_shape(rows, chunk),
                "format": PART_FORMAT,
                "set": token,
                "rank": rank,
                "world": world,
                "rows": [store.rows.start, store.rows.stop],
                "extra": {},  # the set's manifest holds the caller's
            }
            check_header(tensors, manifest, repr)
            tmp = stage_anchor(final, tensors, manifest, default=repr)
        record = {
            "file": final.name,
            "rows": [store.rows.start, store.rows.stop],
            "bytes": tmp.stat().st_size,
            HEADER_CRC: Anchor(tmp).metadata[HEADER_CRC],
        }
    except Exception as err:
        error = err
    try:
        records = _agree(exchange, error, "write its part of the embedding anchor", record)
    except BaseException:
        _remove(tmp)
        raise
    assert tmp is not None
    try:
        atomic.commit(tmp, final, replace=False)
    except Exception as err:
        error = err
    try:
        _agree(exchange, error, "put its part of the embedding anchor in place")
    except BaseException:
        _remove(tmp, final)
        raise
    if rank == 0:
        try:
            head = {
                **_shape(rows, chunk),
                "format": SET_FORMAT,
                "backend": backend_of(rows),
                "hyper": getattr(rows, "local", rows).hyper,
                "optimizer": optimizer_name(rows),
                "extra": extra or {},
                "set": token,
                "world": world,
                "parts": records,
            }
            check_header({}, head, repr, extra)
            write_anchor(path, {}, head, default=repr)
        except Exception as err:
            error = err
    try:
        _agree(exchange, error, "write the embedding anchor's manifest")
    except BaseException:
        _remove(final)
        raise
    if rank == 0:  # committed: what no manifest names is an older set's, or a killed write's
        drop_parts(path, keep={r["file"] for r in records})
    return path


def drop_parts(path: Path, keep: set[str] | frozenset[str] = frozenset()) -> None:
    """Deletes the part files beside `path` but those named `keep` (best effort).

    Called once a new anchor is in place at `path`: the parts no manifest names any more.
    """
    _remove(*(p for p in part_files(path) if p.name not in keep))


def _shape(rows: Any, chunk: int) -> dict[str, Any]:
    """What a set's manifest and its parts both record of the store and its training."""
    store, session = rows.store, rows.session
    return {
        "num_rows": store.num_rows,
        "dim": store.dim,
        "dtype": store.dtype,
        "chunk": chunk,
        "slots": sorted(store.live()[1]),
        "mode": session.mode,
        "step": session.t,
    }


class _Source(NamedTuple):
    """A file holding ids ``[start, stop)`` in chunks (a part, or a whole single anchor)."""

    anchor: Anchor
    start: int
    stop: int


def _format(anchor: Anchor) -> Any:
    """The format a dualtrain manifest says, or None (the reader that follows reports it)."""
    try:
        manifest = json.loads(anchor.metadata.get("dualtrain", "null"))
    except ValueError:
        return None
    return manifest.get("format") if isinstance(manifest, dict) else None


def _set_parts(anchor: Anchor, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts a set's manifest names, checked: part files of its name tiling its ids."""
    parts: Any = manifest.get("parts")
    token = manifest.get("set")
    form = re.compile(re.escape(_stem(anchor.path)) + _PART + re.escape(SUFFIX))
    at, ok = 0, isinstance(parts, list) and bool(parts) and isinstance(token, str)
    for part in parts if ok else []:
        fields = (
            isinstance(part, dict)
            and isinstance(part.get("file"), str)
            and form.fullmatch(part["file"]) is not None
            and part["file"].endswith(f".{token}{SUFFIX}")
            and isinstance(part.get("rows"), list)
            and len(part["rows"]) == 2
            and all(isinstance(v, int) for v in part["rows"])
            and isinstance(part.get("bytes"), int)
            and isinstance(part.get(HEADER_CRC), str)
        )
        if not fields or part["rows"][0] != at or part["rows"][1] < at:
            ok = False
            break
        at = part["rows"][1]
    if not ok or at != manifest["num_rows"]:
        raise anchor.error(
            f"has a malformed manifest: 'parts' must name part files of set {token!r} whose "
            f"ids tile [0, {manifest['num_rows']}) in order; got {parts!r:.300}"
        )
    return parts


def _open_part(anchor: Anchor, manifest: dict[str, Any], part: dict[str, Any]) -> _Source:
    """Part `part` of the set `anchor`, checked against what the set recorded of it."""
    path = anchor.path.with_name(part["file"])
    if not path.is_file():
        raise anchor.error(
            f"names the part {part['file']}, which is not in {path.parent} (the set is "
            f"incomplete: every part must be in the manifest's folder)"
        )
    size = path.stat().st_size
    got = Anchor(path)
    if size != part["bytes"] or got.metadata.get(HEADER_CRC) != part[HEADER_CRC]:
        raise anchor.error(
            f"names the part {part['file']} of {part['bytes']} bytes with header CRC-32 "
            f"{part[HEADER_CRC]}; the file there has {size} bytes and CRC-32 "
            f"{got.metadata.get(HEADER_CRC)} (a part of another write)"
        )
    own = checked_manifest(got, PART_FORMAT, (), ())
    for key in ("num_rows", "dim", "dtype", "chunk", "slots", "mode", "step", "set"):
        if own.get(key) != manifest.get(key):
            raise got.error(
                f"says {key!r} is {own.get(key)!r}; its set {anchor.path.name} says "
                f"{manifest.get(key)!r}"
            )
    if own.get("rows") != part["rows"]:
        raise got.error(f"holds ids {own.get('rows')}; its set says {part['rows']}")
    return _Source(got, *part["rows"])


def _plan(rows: Any, path: Path) -> tuple[dict[str, Any], list[tuple[np.ndarray, np.ndarray, int]]]:
    """What `load_any` writes: the manifest, and (values, table, first local row) copies.

    Everything is checked first, and the CRC-32C of every chunk read.
    """
    store = rows.store
    anchor = Anchor(path)
    if _format(anchor) == SET_FORMAT:
        manifest = checked_manifest(anchor, SET_FORMAT, (), ())
        parts = _set_parts(anchor, manifest)
    else:
        manifest = checked_manifest(anchor)
        parts = None
    if (manifest["num_rows"], manifest["dim"]) != (store.num_rows, store.dim):
        raise CheckpointError(
            f"{path} holds a {manifest['num_rows']} x {manifest['dim']} table; this store is "
            f"{store.num_rows} x {store.dim}"
        )
    check_fit(rows, anchor, manifest)
    lo, hi, chunk = store.rows.start, store.rows.stop, manifest["chunk"]
    if parts is None:
        sources = [_Source(anchor, 0, manifest["num_rows"])]
    else:
        wanted = [p for p in parts if max(p["rows"][0], lo) < min(p["rows"][1], hi)]
        sources = [_open_part(anchor, manifest, p) for p in wanted]
    targets = {"weight": store.table, **{f"state.{k}": v for k, v in store.state.items()}}
    if store.counters is not None and manifest["mode"] == "exact":
        targets["counters"] = store.counters
    copies = []
    for source in sources:
        # Every chunk's name and shape (the file's structure); dtypes of those read, below.
        check_chunks(source.anchor, {**manifest, "num_rows": source.stop - source.start}, {})
        needed = pieces(source.start, source.stop, chunk, lo, hi)
        names = [f"{name}.{p.chunk}" for name in targets for p in needed]
        for name, table in targets.items():
            for p in needed:
                entry = source.anchor.entries[f"{name}.{p.chunk}"]
                if dtypes.kind(entry.dtype) != dtypes.kind(table.dtype):
                    raise source.anchor.error(
                        f"has chunk {name}.{p.chunk} of dtype {entry.dtype.name}; the store's "
                        f"{name!r} is {table.dtype.name}"
                    )
        source.anchor.verify(names)  # the CRC-32Cs of what is read, before a row is written
        for name, table in targets.items():
            for p in needed:
                values = source.anchor.array(f"{name}.{p.chunk}")[p.begin : p.end]
                copies.append((values, table, p.at))
    return manifest, copies


def load_any(rows: Any, path: Path) -> dict[str, Any]:
    """Loads a set or a single-file anchor at `path` into `rows`' store, of any world size.

    A sharded store's load is a collective: every rank checks what it reads, and no rank
    writes a row unless every rank can (an error is raised on every rank). An unsharded
    store loading a single-file anchor goes through `load_rows`, as before sets.

    Returns:
        The manifest (a set's: with its ``parts``).
    """
    session = session_of(rows)
    store = rows.store
    shard = store.shard
    if shard is None and _format(Anchor(path)) != SET_FORMAT:
        return load_rows(rows, path)
    error: BaseException | None = None
    manifest: dict[str, Any] = {}
    copies: list[tuple[np.ndarray, np.ndarray, int]] = []
    try:
        manifest, copies = _plan(rows, path)
    except Exception as err:
        if shard is None:
            raise
        error = err
    if shard is not None:
        _agree(shard.exchange, error, f"load the embedding anchor {path}")
    write_loaded(session, copies, manifest)
    return manifest
