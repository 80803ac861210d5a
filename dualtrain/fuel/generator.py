"""FuelGenerator: packs the raw images listed in a CSV into HDF5 or npz files."""

from __future__ import annotations

import bisect
import dataclasses
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, overload

import numpy as np

from dualtrain import atomic
from dualtrain.errors import ArgumentError, PackError, bad_argument
from dualtrain.fuel import images
from dualtrain.fuel.filelist import FileList, Row, SkippedRow, read_file_list
from dualtrain.fuel.generate_args import (
    SETTINGS,
    check_depth,
    check_generate,
    check_setting,
    pixel_limit,
    resolve_settings,
)
from dualtrain.fuel.generator_props import PROPERTIES, bind_properties, check_properties
from dualtrain.fuel.writer import PackWriter

__all__ = ["FuelGenerator", "PackReport", "shard_paths"]

_CHUNK = 16  # rows per task handed to a worker thread


@dataclasses.dataclass(frozen=True)
class PackReport:
    """What `FuelGenerator.generate` wrote.

    Attributes:
        paths: the pack files, one per shard.
        rows: rows written, over all shards.
        skipped: rows left out under ``on_error="skip"`` (line, column, reason).
        seconds: wall time of the whole run.
    """

    paths: list[str]
    rows: int
    skipped: list[SkippedRow]
    seconds: float

    @property
    def images_per_s(self) -> float:
        """Rows packed per second."""
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


class FuelGenerator:
    """Packs the images listed in a CSV file, with their labels, into a Fuel pack.

    Three ways to give the properties, one at a time (a mix is an ArgumentError naming
    both): by position in Nebulae's order, ``FuelGenerator(file_dir, file_list, dtype,
    is_seq)``; by keyword; or as one dict, ``FuelGenerator(config)`` or
    ``FuelGenerator(config=...)``. A config may also hold `generate`'s image settings
    (see `modify`).

    Args:
        file_dir: the folder the CSV's file names are relative to.
        file_list: the CSV file: a header row of keys, the image files in the first
            column, values in the others (a path, or a name inside `file_dir`).
        dtype: the column types, one per column (the image column's ``"vuint8"`` may be
            left out) or a dict key -> type; see `dualtrain.fuel.columns`.
        is_seq: the first column holds a quoted, comma-separated list of frame files.
        delimiter, quotechar: the CSV dialect.
        allow_outside: accept data files that resolve outside `file_dir` (absolute paths,
            ``..``, symbolic links leading out); by default such a row is a PackError.
        config: a dict of the properties above (mutually exclusive with them).
    """

    @overload
    def __init__(self, config: Mapping[str, Any], /) -> None: ...

    @overload
    def __init__(self, *, config: Mapping[str, Any]) -> None: ...

    @overload
    def __init__(
        self,
        file_dir: str | os.PathLike[str],
        file_list: str | os.PathLike[str],
        dtype: Sequence[str] | Mapping[str, str],
        is_seq: bool = False,
        delimiter: str = ",",
        quotechar: str = '"',
        allow_outside: bool = False,
    ) -> None: ...

    def __init__(
        self,
        *args: Any,
        config: Mapping[str, Any] | None = None,
        file_dir: str | os.PathLike[str] | None = None,
        file_list: str | os.PathLike[str] | None = None,
        dtype: Sequence[str] | Mapping[str, str] | None = None,
        is_seq: bool | None = None,
        delimiter: str | None = None,
        quotechar: str | None = None,
        allow_outside: bool | None = None,
    ) -> None:
        keywords = {
            "file_dir": file_dir, "file_list": file_list, "dtype": dtype, "is_seq": is_seq,
            "delimiter": delimiter, "quotechar": quotechar, "allow_outside": allow_outside,
        }  # fmt: skip
        given = bind_properties(args, config, keywords)
        self._props: dict[str, Any] = {}
        self._settings: dict[str, Any] = {}
        self.modify(config=given)

    def modify(self, config: Mapping[str, Any] | None = None, **changes: Any) -> None:
        """Changes properties and `generate`'s settings, from a dict or from keywords.

        ``fg.modify(height=200, width=200)`` and ``fg.modify(config={"height": 200,
        "width": 200})`` are the same; a later ``fg.generate(dst_path)`` uses them (an
        argument given to `generate` wins over them). Every key and value is checked
        before anything changes: a bad one is an ArgumentError and leaves the generator
        as it was.

        Keys: the properties ``file_dir``, ``file_list``, ``dtype``, ``is_seq``,
        ``delimiter``, ``quotechar``, ``allow_outside``; the settings ``height``,
        ``width``, ``channel``, ``encode``, ``shards``, ``keep_exif``, ``quality``,
        ``depth`` (see `generate`).
        """
        if config is not None and not isinstance(config, Mapping):
            raise bad_argument("config", config, "a dict of properties and settings, or None")
        if config and changes:
            raise ArgumentError(
                f"config and the keyword arguments {sorted(changes)} are mutually exclusive: "
                f"pass a dict or keywords; got config with keys {sorted(config)} too"
            )
        updates = {**dict(config or {}), **changes}
        unknown = [k for k in updates if k not in PROPERTIES and k not in SETTINGS]
        if unknown:
            raise bad_argument("config", unknown, f"keys among {[*PROPERTIES, *SETTINGS]}")
        settings = {k: v for k, v in updates.items() if k in SETTINGS}
        for key, value in settings.items():
            check_setting(key, value)
        changed = {k: v for k, v in updates.items() if k in PROPERTIES}
        # The files are looked at again only when a property changes (or on the first call).
        props = (
            check_properties(self._props, changed) if changed or not self._props else self._props
        )
        self._props = props
        self._settings = {**self._settings, **settings}

    @property
    def config(self) -> dict[str, Any]:
        """The current properties, and the settings `modify` has set."""
        return {**self._props, **self._settings}

    def generate(
        self,
        dst_path: str,
        height: int | None = None,
        width: int | None = None,
        channel: int | None = None,
        encode: str | None = None,
        shards: int | None = None,
        keep_exif: bool | None = None,
        *,
        quality: int | None = None,
        workers: int | None = None,
        on_error: str = "raise",
        depth: str | None = None,
        max_image_pixels: int | None = None,
        reencode: bool = True,
    ) -> PackReport:
        """Decodes, orients, converts, resizes and re-encodes every image into a pack.

        A setting left out (None) is the one `modify` set, else its default (below);
        `height` and `width` have none and must come from one of the two.

        Args:
            dst_path: the pack file (.h5, .hdf5 or .npz). With ``shards=k > 1`` the files are
                ``stem-00000-of-0000k.ext`` beside it. Every file of one run carries the
                same run id (metadata ``run``, 32 hex digits) with its ``shard`` index and
                the ``shards`` count, so that shards of different runs are never read as one.
            height: the stored image height in pixels.
            width: the stored image width in pixels.
            channel: 1 (grey), 3 (RGB, the default) or 4 (RGBA); 1 for a depth other than
                uint8.
            encode: "JPEG" (the default; at `quality`, uint8 only), "PNG" (lossless; uint8
                or uint16) or "RAW" (the pixel array as ``.npy`` bytes, uncompressed; any
                depth); any case.
            shards: the number of files, of near-equal row counts (at most the row count;
                default 1).
            keep_exif: store each file's EXIF block in ``<key>.exif`` (default True).
            quality: JPEG quality, 1..95 (default 90).
            workers: worker threads; None uses every core for more than 64 rows.
            on_error: "raise" stops at the first bad row; "skip" leaves bad rows out and
                lists them in the report.
            depth: the pixel dtype images are stored at: "uint8" (default), or for
                one-channel images "uint16", "int32" or "float32". An image of another
                depth is a bad row, never scaled or clipped (see `dualtrain.fuel.images`).
            max_image_pixels: the most pixels (width x height) a raw image may have; larger
                ones are bad rows (a guard against decompression bombs). None uses Pillow's
                process-wide limit ``PIL.Image.MAX_IMAGE_PIXELS`` (89,478,485 unless
                changed); a value above it must be allowed there first.
            reencode: False packs a file that needs no change as it is, its bytes copied
                after a check that it decodes (no second JPEG loss, and no encoding): a
                JPEG (for ``encode="JPEG"``) or PNG (``"PNG"``) file of `height` x `width`
                in the `channel` mode at uint8, upright, whole, and without EXIF unless
                `keep_exif`. Other files are re-encoded.
                True (the default, as Nebulae) re-encodes every file at `quality`.

        Returns:
            A PackReport. The files appear under their final names only when every shard
            is complete; temporary files of writers that were killed are removed first.

        Raises:
            PackError: a bad row (missing, unreadable, truncated, malformed, too large or
                too deep image, a path outside `file_dir`, bad value, wrong cell count),
                naming the CSV file, line and column; a bad header or a broken CSV.
            OSError: the disk's own error (a full disk); no temporary file is left.
        """
        started = time.perf_counter()
        given = {
            "height": height, "width": width, "channel": channel, "encode": encode,
            "shards": shards, "keep_exif": keep_exif, "quality": quality, "depth": depth,
        }  # fmt: skip
        got = resolve_settings(given, self._settings)
        height, width, channel, shards, quality = (
            got[k] for k in ("height", "width", "channel", "shards", "quality")
        )
        encode, keep_exif, depth = got["encode"], got["keep_exif"], got["depth"]
        check_generate(dst_path, height, width, channel, encode, shards, quality, on_error)
        check_depth(depth, channel, encode.upper(), keep_exif)
        limit = pixel_limit(max_image_pixels)
        if workers is not None and (
            not isinstance(workers, int) or isinstance(workers, bool) or workers < 0
        ):
            raise bad_argument("workers", workers, "a non-negative int or None")
        if not isinstance(reencode, (bool, np.bool_)):
            raise bad_argument("reencode", reencode, "True or False")
        encode = encode.upper()
        # NumPy ints pass the checks; the metadata is JSON, which wants Python ints.
        height, width, channel, shards, quality = map(
            int, (height, width, channel, shards, quality)
        )
        p = self._props
        listing = read_file_list(
            p["file_list"], p["file_dir"], p["dtype"], is_seq=p["is_seq"],
            delimiter=p["delimiter"], quotechar=p["quotechar"], on_error=on_error,
            allow_outside=p["allow_outside"],
        )  # fmt: skip
        if not listing.rows:
            raise _empty(p["file_list"], listing)
        if shards > max(len(listing.rows), 1):
            raise bad_argument("shards", shards, f"at most the {len(listing.rows)} good rows")
        paths = shard_paths(dst_path, shards)
        # Housekeeping: the temporary files of killed writers in this folder.
        atomic.sweep_stale(os.path.dirname(os.path.abspath(dst_path)))
        image = {
            "height": height, "width": width, "channel": channel, "encode": encode,
            "dtype": depth,
        }  # fmt: skip
        run = uuid.uuid4().hex
        writers: list[PackWriter] = []
        try:
            for i, path in enumerate(paths):
                writers.append(self._writer(listing, path, keep_exif, image, (run, i, shards)))
            settings = (
                height, width, channel, encode, quality, keep_exif, depth, limit, bool(reencode)
            )  # fmt: skip
            bounds = np.linspace(0, len(listing.rows), shards + 1).round().astype(int).tolist()
            for index, (row, result) in enumerate(
                _encoded(listing.rows, settings, workers, len(listing.rows))
            ):
                if isinstance(result, _Failure):  # the image could not be packed
                    if on_error == "raise":
                        raise listing.error(
                            row.line, listing.image_key, result.reason
                        ) from result.error
                    listing.skipped.append(SkippedRow(row.line, listing.image_key, result.reason))
                    continue
                shard = bisect.bisect_right(bounds, index) - 1  # 12 µs a row by NumPy
                self._append(writers[shard], listing, row, result)
            if not any(w.rows for w in writers):
                raise _empty(p["file_list"], listing)
            # Every shard complete on disk before the first takes its final name: a crash
            # during the renames leaves shards of two runs, which readers tell apart by run.
            for w in writers:
                w.finish()
            for w in writers:
                w.publish()
        except BaseException:
            for w in writers:
                w.abort()
            raise
        written = sum(w.rows for w in writers)
        listing.skipped.sort(key=lambda s: s.line)
        return PackReport(paths, written, listing.skipped, time.perf_counter() - started)

    def _writer(
        self,
        listing: FileList,
        path: str,
        keep_exif: bool,
        image: dict[str, Any],
        shard: tuple[str, int, int],
    ) -> PackWriter:
        run, i, k = shard
        meta = {"image": image, "run": run, "shard": i, "shards": k, "exif": keep_exif}
        return PackWriter(
            path, listing.columns, listing.image_key, is_seq=self._props["is_seq"],
            keep_exif=keep_exif, meta=meta,
        )  # fmt: skip

    def _append(self, writer: PackWriter, listing: FileList, row: Row, result: Any) -> None:
        frames, exif = result
        key = listing.image_key
        values = {key: frames if self._props["is_seq"] else frames[0], f"{key}.exif": exif}
        writer.append({**values, **row.values})


def _empty(file_list: str, listing: FileList) -> PackError:
    """The error for a run with no row to write: Fuel writes no empty pack."""
    skipped = listing.skipped
    why = (
        f"all {len(skipped)} rows were skipped (the first: line {skipped[0].line}, "
        f"{skipped[0].reason})"
        if skipped
        else "it has a header and no rows"
    )
    return PackError(f"file_list {file_list!r}: no row to pack, {why}; no pack is written")


def shard_paths(dst_path: str, shards: int) -> list[str]:
    """The file names of a pack in `shards` files (just `dst_path` for one)."""
    if shards == 1:
        return [dst_path]
    root, ext = os.path.splitext(dst_path)
    return [f"{root}-{i:05d}-of-{shards:05d}{ext}" for i in range(shards)]


@dataclasses.dataclass(frozen=True)
class _Failure:
    """Why one row's image could not be packed, and the exception behind it."""

    reason: str
    error: BaseException


def _encoded(
    rows: list[Row], settings: tuple[Any, ...], workers: int | None, n: int
) -> Iterator[tuple[Row, Any]]:
    """(row, (frames, exif) or a _Failure) for every row, in order."""
    if workers is None:
        workers = (os.cpu_count() or 1) if n > 64 else 0
    chunks = [rows[i : i + _CHUNK] for i in range(0, len(rows), _CHUNK)]
    if workers == 0:
        for chunk in chunks:
            yield from zip(chunk, _encode_chunk([r.files for r in chunk], settings), strict=True)
        return
    # Threads, not processes: Pillow releases the GIL while it decodes, resizes and encodes,
    # and threads start at once (spawned processes took ~2 s here, longer than 600 images).
    with ThreadPoolExecutor(workers, thread_name_prefix="dualtrain-pack") as pool:
        jobs = pool.map(
            _encode_chunk, [[r.files for r in c] for c in chunks], [settings] * len(chunks)
        )
        for chunk, results in zip(chunks, jobs, strict=True):
            yield from zip(chunk, results, strict=True)


def _encode_chunk(files: list[tuple[str, ...]], settings: tuple[Any, ...]) -> list[Any]:
    height, width, channel, encode, quality, keep_exif, depth, limit, reencode = settings
    out: list[Any] = []
    for row_files in files:
        frames: list[bytes] = []
        exif = b""
        path = row_files[0]
        try:
            for j, path in enumerate(row_files):
                with open(path, "rb") as f:
                    raw = f.read()
                kept = None if reencode else images.as_stored(
                    raw, height, width, channel, encode, keep_exif=keep_exif, depth=depth,
                    max_pixels=limit,
                )  # fmt: skip
                if kept is not None:  # stored as it is: the reader decodes what it holds
                    frames.append(raw)
                    exif = kept if j == 0 else exif
                    continue
                img, frame_exif = images.prepare(
                    raw, height, width, channel, keep_exif=keep_exif, depth=depth,
                    max_pixels=limit,
                )  # fmt: skip
                frames.append(images.encode(img, encode, quality))
                exif = frame_exif if j == 0 else exif
        except images.ImageError as e:
            out.append(_Failure(f"image {path!r} {e}", e))
            continue
        # Whatever Pillow raises on a bad file (OSError, SyntaxError, ValueError,
        # DecompressionBombError, a DecompressionBombWarning made an error by the warning
        # filters, struct.error, ...) makes a bad row, never a crash of the whole run.
        except Exception as e:
            out.append(_Failure(f"cannot read image {path!r}: {type(e).__name__}: {e}", e))
            continue
        out.append((frames, exif))
    return out
