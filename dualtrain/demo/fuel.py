"""The demo's Fuel part: pack synthetic images, then train one Craft from a Tank twice.

Images of four classes (a colour dominating a noisy 16x16 picture) are written as PNG files
with a CSV list, packed with FuelGenerator, and served by a Tank with a Comburant under torch
and under JAX with the same seed: the batches are identical, so the two loss curves agree
to float32 rounding. Each Tank preloads: its decoded rows stay in a cache held to a 4 MiB
budget, so only the first epoch decodes PNG; the Comburant still draws anew every epoch.
"""

from __future__ import annotations

import csv
import os
import tempfile
from typing import Any

import numpy as np
from PIL import Image
from rich.console import Console

from dualtrain import backends
from dualtrain.craft import Craft, dock
from dualtrain.demo.table import loss_table
from dualtrain.fuel import Brighten, Comburant, Flip, FuelGenerator, Tank

__all__ = ["ImageNet16", "make_images", "run_fuel"]

AUGMENT = Comburant(Flip(), Brighten(0.05))
PRELOAD_BUDGET = 4 << 20  # bytes: the 256 decoded 16x16 rows need about 0.2 MiB


class ImageNet16(Craft):
    """A small classifier of flattened 16x16x3 images."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__("IMG16")
        self.fc1 = dock.Dense(16 * 16 * 3, 32)
        self.fc2 = dock.Dense(32, classes)

    def run(self, x: Any) -> Any:
        return self.fc2(dock.relu(self.fc1(x)))


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


def _prep(sample: dict) -> dict:
    return {**sample, "image": AUGMENT(sample["image"])}


def run_fuel(console: Console, seed: int = 0, n: int = 256, steps: int = 60) -> dict:
    """Packs `n` images, trains from a Tank under torch and JAX, prints both curves."""
    with tempfile.TemporaryDirectory() as folder:
        listing = make_images(folder, n, seed)
        gen = FuelGenerator(file_dir=folder, file_list=listing, dtype=["vuint8", "int64"])
        report = gen.generate(f"{folder}/pack.h5", 16, 16, encode="PNG", shards=2)
        console.print(
            f"FuelGenerator: {report.rows} images (20x20 -> 16x16 PNG) packed into "
            f"{len(report.paths)} shards at {report.images_per_s:.0f} images/s"
        )
        losses, preload, ladders = {}, {}, {}
        for name in ("torch", "jax"):
            spec = {"image": "uint8", "label": "int64" if name == "torch" else "int32"}
            with Tank(report.paths, spec, 32, prep_fn=_prep, seed=seed, to=name, workers=2,
                      cast="same_kind", preload=PRELOAD_BUDGET) as tank:  # fmt: skip
                part = backends.load_part(name, "demo")
                losses[name], ladders[name] = part.train_from_tank(
                    ImageNet16(), tank, lr=0.2, steps=steps, seed=seed
                )
                assert tank.preloader is not None
                preload[name] = tank.preloader.stats()
    title = f"one Craft trained from a Tank ({steps} batches of 32, same seed)"
    console.print(loss_table(title, "batch", losses, rows=5))
    stats = preload["jax"]
    console.print(
        f"Preloader (both Tanks): {stats['loads']} PNG decodes for {steps * 32} samples, "
        f"{stats['resident_bytes'] / 1024:.0f} KiB held of a {PRELOAD_BUDGET >> 20} MiB "
        f"budget (peak {stats['peak_resident_bytes'] / 1024:.0f} KiB), "
        f"{stats['hits'] + stats['prefetch_waits']} served from memory"
    )
    console.print(
        f"Compile ladder (verified against eager on the first batch): torch forward "
        f"{ladders['torch']}; JAX step {ladders['jax']}"
    )
    return {"fuel_torch_losses": losses["torch"], "fuel_jax_losses": losses["jax"],
            "packed_rows": report.rows, "preload_stats": preload,
            "ladders": ladders}  # fmt: skip
