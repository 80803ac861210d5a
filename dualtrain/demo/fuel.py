"""Pictures for the examples and the Multiverse part: four classes of noisy colour images.

Each picture is a noisy 20x20 RGB image in which one colour dominates (red, green, blue, or
none: four classes), written as PNG with a CSV list that FuelGenerator reads.
"""

from __future__ import annotations

import csv
import os

import numpy as np
from PIL import Image

__all__ = ["make_images"]


def make_images(folder: str, n: int, seed: int) -> str:
    """`n` PNG files in `folder`, class = the dominant colour, and their CSV list."""
    rng = np.random.default_rng(seed)
    rows = [["image", "label"]]
    for i in range(n):
        label = int(rng.integers(0, 4))
        pixels = rng.normal(90, 40, (20, 20, 3))
        if label < 3:
            pixels[..., label] += 80
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(f"{folder}/{i}.png")
        rows.append([f"{i}.png", str(label)])
    path = os.path.join(folder, "list.csv")
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path
