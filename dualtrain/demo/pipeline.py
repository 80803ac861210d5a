"""The demo's pipeline: images made on the spot -> packs -> Tanks -> one Craft, both frameworks.

Pillow draws small grey pictures of four shapes (circle, square, triangle, cross) at random
sizes and places, with noise, and writes them as PNG files with a CSV list. FuelGenerator
packs a training and a held-out list; Tanks serve them (a Comburant augments the training
rows; the decoded rows are preloaded within a budget) as NCHW floats in [0, 1]. One Craft (a
small CNN) trains a few epochs under each framework through its compile ladder, with a
DashBoard drawing live and writing its CSV and PNG curves. Evaluation reads every held-out
row once (a pad-and-mask Tank). Last, TimeMachine drops the torch model and a fresh JAX
module loaded from it predicts what torch predicts.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from dualtrain.aerolog import DashBoard
from dualtrain.checkpoint import TimeMachine
from dualtrain.cockpit import CPU, GPU, Engine, GPUtil
from dualtrain.craft import Craft, dock
from dualtrain.craft.seams import craft_part
from dualtrain.demo.seams import demo_part
from dualtrain.fuel import Brighten, Comburant, Flip, FuelGenerator, Tank

__all__ = ["SHAPES", "ShapeNet", "draw_shapes", "run_pipeline"]

SHAPES = ("circle", "square", "triangle", "cross")
SIZE = 28  # pixels, square
AUGMENT = Comburant(Flip(), Brighten(0.1))
PRELOAD_BUDGET = 8 << 20  # bytes: far above the decoded rows (~0.4 MiB), so each decodes once


class ShapeNet(Craft):
    """A small CNN for 1x28x28 images: two conv + pool blocks, then a Dense classifier."""

    def __init__(self, classes: int = len(SHAPES)) -> None:
        super().__init__("SHAPES")
        self.conv1 = dock.Conv(1, 8, 3, padding=1)
        self.conv2 = dock.Conv(8, 16, 3, padding=1)
        self.pool = dock.MaxPool(2)
        self.flat = dock.Flatten()
        self.fc = dock.Dense(16 * 7 * 7, classes)

    def run(self, x: Any) -> Any:
        x = self.pool(dock.relu(self.conv1(x)))
        x = self.pool(dock.relu(self.conv2(x)))
        return self.fc(self.flat(x))


def draw_shapes(folder: Path, n: int, seed: int) -> Path:
    """`n` PNG pictures of random shapes in `folder` and their CSV list (image, label)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = [["image", "label"]]
    for i in range(n):
        label = int(rng.integers(0, len(SHAPES)))
        background = rng.normal(60, 25, (SIZE, SIZE)).clip(0, 255).astype(np.uint8)
        image = Image.fromarray(background, mode="L")
        draw = ImageDraw.Draw(image)
        r = float(rng.uniform(6, 11))
        cx, cy = rng.uniform(r + 1, SIZE - r - 1, size=2)
        ink = int(rng.integers(170, 256))
        if SHAPES[label] == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=ink)
        elif SHAPES[label] == "square":
            draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=ink)
        elif SHAPES[label] == "triangle":
            draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=ink)
        else:
            w = max(2.0, r / 3)
            draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=ink)
            draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=ink)
        image.save(folder / f"{i}.png")
        rows.append([f"{i}.png", str(label)])
    listing = folder / "list.csv"
    with listing.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return listing


class _Staged:
    """A DashBoard whose stages carry a framework's name ("torch train", "jax test")."""

    def __init__(self, dash: DashBoard, name: str) -> None:
        self.dash, self.name = dash, name

    def feed(self, iterable: Any) -> Any:
        return self.dash.feed(iterable)

    def gauge(self, entry: Any, mile: int, epoch: int, mpe: int, stage: str, **kw: Any) -> None:
        self.dash.gauge(entry, mile, epoch, mpe, f"{self.name} {stage}", **kw)


def _augment(sample: dict) -> dict:
    return {**sample, "image": AUGMENT(sample["image"])}


def run_pipeline(
    console: Any, out: Path, names: tuple[str, ...], *, epochs: int, seed: int, quick: bool
) -> dict[str, Any]:
    """Runs the pipeline under each framework in `names`; writes into `out`; returns results."""
    n_train, n_test = (512, 96) if quick else (640, 192)
    data = out / "data"
    packs = {}
    for split, n, offset in (("train", n_train, 0), ("test", n_test, 1)):
        listing = draw_shapes(data / split, n, seed + offset)
        gen = FuelGenerator(file_dir=str(listing.parent), file_list=str(listing),
                            dtype=["vuint8", "int64"])  # fmt: skip
        report = gen.generate(str(data / f"{split}.h5"), SIZE, SIZE, channel=1, encode="PNG")
        packs[split] = report.paths
        console.print(
            f"FuelGenerator: {report.rows} {split} pictures of {len(SHAPES)} shapes packed "
            f"({report.images_per_s:.0f} images/s)"
        )
    # A GPU when one has room, else the CPU (an Engine that warned would only say so).
    engine = Engine(GPU, least_mem=1024) if GPUtil().available(1, 1024) else Engine(CPU)
    console.print(f"Engine: {engine}")
    dash = DashBoard(out / "aerolog", window=5, format={"accuracy": (".1f", "percent")},
                     console=console)  # fmt: skip
    results: dict[str, Any] = {"accuracy": {}, "logits": {}}
    modules = {}
    for name in names:
        spec = {"image": "uint8", "label": "int64" if name == "torch" else "int32"}
        common: dict[str, Any] = {"to": name, "layout": "NCHW", "scale": 1 / 255,
                                  "cast": "same_kind", "device": engine}  # fmt: skip
        train = Tank(packs["train"], spec, 32, prep_fn=_augment, seed=seed, workers=2,
                     preload=PRELOAD_BUDGET, **common)  # fmt: skip
        test = Tank(packs["test"], spec, 64, shuffle=False, pad=True, **common)
        with train, test:
            part = demo_part(name)
            module, accuracy, ladder = part.fit(ShapeNet(), train, epochs=epochs, lr=0.01,
                                                seed=seed, dash=_Staged(dash, name),
                                                test=test, device=engine)  # fmt: skip
            logits, labels = part.evaluate(module, test)
            assert train.preloader is not None
            results[f"{name}_preload"] = train.preloader.stats()
        modules[name] = module
        results["accuracy"][name] = accuracy
        results.setdefault("ladders", {})[name] = ladder
        stats = results[f"{name}_preload"]
        console.print(
            f"{name}: compile ladder (starts at once; a rung is tried when it pays back) "
            f"{ladder}; "
            f"preloader: {stats['loads']} PNG decodes for {epochs * train.rows_per_epoch} "
            f"rows served, peak {stats['peak_resident_bytes'] / 1024:.0f} KiB of a "
            f"{PRELOAD_BUDGET >> 20} MiB budget"
        )
        results["logits"][name] = logits
        results["labels"] = labels
    dash.close()
    results["logs"] = dash.log(record="history.csv")
    if "torch" in names and "jax" in names:
        results["crossing"] = _cross(console, out, modules["torch"], packs["test"], results)
    return results


def _cross(console: Any, out: Path, torch_module: Any, test_pack: Any, results: dict) -> dict:
    """Drops the torch model; a fresh JAX module loads it and predicts the held-out rows."""
    tm = TimeMachine(ckpt_path=str(out / "ckpt"), save_path=str(out / "ckpt"), max_anchors=2)
    anchor = tm.drop(torch_module)
    fresh = craft_part("jax").realize(ShapeNet(), seed=12345)
    tm.to(fresh, frozen=True)
    spec = {"image": "uint8", "label": "int32"}
    with Tank(test_pack, spec, 64, shuffle=False, pad=True, to="jax", layout="NCHW",
              scale=1 / 255, cast="same_kind") as test:  # fmt: skip
        logits, _ = demo_part("jax").evaluate(fresh, test)
    expected = results["logits"]["torch"]
    difference = float(np.abs(logits - expected).max())
    agree = float((logits.argmax(1) == expected.argmax(1)).mean())
    console.print(
        f"TimeMachine: {anchor.name} dropped by torch, loaded into a fresh JAX module: its "
        f"held-out predictions agree on {agree:.1%} of rows (logits differ by {difference:.1e})"
    )
    return {"anchor": str(anchor), "max_difference": difference, "agreement": agree}


def describe(console: Any, out: Path, results: dict[str, Any]) -> None:
    """The closing lines: where the outputs are, the accuracy reached, the curves' PNG."""
    for name, accuracy in results["accuracy"].items():
        console.print(
            f"{name}: held-out accuracy {accuracy[-1]:.1%} after {len(accuracy)} epochs "
            f"({len(SHAPES)} classes: chance is {1 / len(SHAPES):.0%})"
        )
    logs = [Path(p) for p in results["logs"]]
    curves = next((p for p in logs if p.name == "loss.png"), None)
    console.print(f"outputs in {os.path.abspath(out)}: packs (data/), logs (aerolog/), "
                  f"checkpoints (ckpt/)")  # fmt: skip
    if curves is not None:
        console.print(f"loss curves: {os.path.abspath(curves)}")
