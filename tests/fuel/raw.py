"""Raw image folders with CSV file lists, made on the spot for the Fuel tests."""

from __future__ import annotations

import csv
import os

import numpy as np
from PIL import Image

SPEC = {"image": "uint8", "label": "int64", "box": "float32", "tags": "vint32", "name": "str"}
DTYPES = ["vuint8", "int64", "float32", "vint32", "str"]


def picture(i: int, height: int = 20, width: int = 24, channel: int = 3) -> np.ndarray:
    """A smooth picture with some noise, different for every i."""
    rng = np.random.default_rng(i)
    yy, xx = np.mgrid[0:height, 0:width]
    planes = [(xx * (i % 7 + 3) + yy * c * 5 + 17 * i) % 256 for c in range(channel)]
    noisy = np.stack(planes, -1) + rng.normal(0, 8, (height, width, channel))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def make_folder(folder: str, n: int, *, fmt: str = "png", size: tuple[int, int] = (20, 24)) -> str:
    """`n` images (i.png) with a CSV of label, box, tags and name; returns the CSV path."""
    os.makedirs(folder, exist_ok=True)
    rows = [["image", "label", "box", "tags", "name"]]
    for i in range(n):
        Image.fromarray(picture(i, *size)).save(os.path.join(folder, f"{i}.{fmt}"))
        tags = ",".join(str(j * i) for j in range(i % 4))
        rows.append([f"{i}.{fmt}", str(i % 5), f"{i},{i / 2},-1.5", tags, f"item {i}"])
    return write_csv(os.path.join(folder, "list.csv"), rows)


def write_csv(path: str, rows: list[list[str]]) -> str:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def expected_row(i: int) -> dict:
    """The values make_folder wrote for row i."""
    return {
        "label": i % 5,
        "box": np.array([i, i / 2, -1.5], np.float32),
        "tags": np.array([j * i for j in range(i % 4)], np.int32),
        "name": f"item {i}",
    }


def stored_meta(path: str) -> dict:
    """The metadata a pack file stores (read directly, one shard at a time)."""
    import json

    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as f:
            return json.loads(bytes(f["__fuel__"]).decode())
    import h5py

    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["__fuel__"])


def png16(arr: np.ndarray) -> bytes:
    """A 16-bit PNG of a uint16 array (H, W) grey or (H, W, 2/3/4), written by hand.

    Pillow writes 16-bit PNGs for grey only; this makes the colour ones it cannot.
    """
    import struct
    import zlib

    arr = np.asarray(arr, np.uint16)
    height, width = arr.shape[:2]
    channels = 1 if arr.ndim == 2 else arr.shape[2]
    colour_type = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    rows = b"".join(b"\x00" + arr[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def deep_picture(i: int, dtype: str, height: int = 12, width: int = 10) -> np.ndarray:
    """A one-channel (H, W) picture whose values use the whole range of `dtype`."""
    rng = np.random.default_rng(i)
    if dtype == "uint16":
        return rng.integers(256, 65536, (height, width)).astype(np.uint16)
    if dtype == "int32":
        return rng.integers(-(2**31), 2**31, (height, width)).astype(np.int32)
    return (rng.standard_normal((height, width)) * 1e6).astype(np.float32)


def save_deep(path: str, arr: np.ndarray) -> None:
    """Saves a deep picture: 16-bit PNG for uint16, 32-bit TIFF for int32 and float32."""
    if path.endswith(".png"):
        with open(path, "wb") as f:
            f.write(png16(arr))
    else:
        Image.fromarray(arr).save(path, format="TIFF")


def write_table(path: str, columns: dict[str, np.ndarray], *, chunked: bool = False) -> str:
    """A pack of numeric columns (row i of each array is row i; a list of 1-D arrays, one a
    row, is a variable-length column).

    HDF5 by h5py, or npz (`path` ends in .npz); the metadata is the pack format's
    (docs/fuel.md, "The format"). `chunked` stores the HDF5 datasets chunked, so readers
    take them through h5py rather than a mapping.
    """
    import json

    import h5py

    count = len(next(iter(columns.values())))
    meta = {
        "format": "dualtrain.fuel", "version": 1, "count": count, "keys": list(columns),
        "columns": {
            key: {"type": str(a.dtype), "kind": "value", "shape": list(a.shape[1:])}
            if isinstance(a, np.ndarray) else {"type": f"v{a[0].dtype}", "kind": "value"}
            for key, a in columns.items()
        },
    }  # fmt: skip
    # A list of 1-D arrays is a variable-length column: its values and their offsets.
    flat: dict[str, np.ndarray] = {}
    for key, a in columns.items():
        if isinstance(a, np.ndarray):
            flat[key] = a
        else:
            flat[key] = np.concatenate(a)
            flat[f"{key}.offsets"] = np.concatenate([[0], np.cumsum([len(v) for v in a])])
    columns = flat
    if path.endswith(".npz"):
        text = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        np.savez(path, **columns, __fuel__=text)
        return path
    with h5py.File(path, "w") as f:
        for key, a in columns.items():
            chunks = (max(1, min(7, count)), *a.shape[1:]) if chunked else None
            f.create_dataset(key, data=a, chunks=chunks)
        f.attrs["__fuel__"] = json.dumps(meta)
    return path
