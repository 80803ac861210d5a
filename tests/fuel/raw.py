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
