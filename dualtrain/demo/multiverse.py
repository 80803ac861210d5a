"""The demo's Multiverse part: one Craft trained data-parallel on two workers, torch and JAX.

The images of the Fuel part are packed once; then `Multiverse` spawns `nworld` workers under
torch (gloo processes) and under JAX (processes joined by ``jax.distributed``). Each worker
serves its share of every epoch from a Tank that `mv.sync` shards, and steps a data-parallel
learner whose loss is the mean over all workers' rows. The two frameworks start from the
same weights and see the same batches, so their curves agree to float32 rounding.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from rich.console import Console

from dualtrain.craft import Craft, dock
from dualtrain.demo.seams import demo_part
from dualtrain.demo.table import loss_table
from dualtrain.fuel import FuelGenerator, Tank
from dualtrain.multiverse import Multiverse

__all__ = ["FlatNet", "run_multiverse", "universe"]

BATCH = 16  # rows per worker and step


class FlatNet(Craft):
    """Flatten a 3x16x16 image, Dense 768 -> 32, ReLU, Dense 32 -> 4."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__("FLAT16")
        self.flat = dock.Flatten()
        self.fc1 = dock.Dense(3 * 16 * 16, 32)
        self.fc2 = dock.Dense(32, classes)

    def run(self, x: Any) -> Any:
        return self.fc2(dock.relu(self.fc1(self.flat(x))))


def universe(mv: Multiverse, paths: list[str], steps: int, lr: float, seed: int) -> dict:
    """One worker of the demo: its Tank's share, the adapter's data-parallel loop."""
    label = "int64" if mv.backend == "torch" else "int32"
    with Tank(paths, {"image": "uint8", "label": label}, BATCH, seed=seed, to=mv.backend,
              layout="NCHW", scale=1 / 255, cast="same_kind") as tank:  # fmt: skip
        part = demo_part(mv.backend)
        losses = part.train_parallel(mv, FlatNet(), tank, lr=lr, steps=steps, seed=seed)
    return {"losses": losses, "nworld": mv.nworld, "rows_per_worker": tank.rows_per_epoch}


def run_multiverse(
    console: Console, seed: int = 0, nworld: int = 2, steps: int = 60,
    names: tuple[str, ...] = ("torch", "jax"),
) -> dict:  # fmt: skip
    """Packs 256 images, trains FlatNet on `nworld` workers under each framework of `names`."""
    from dualtrain.demo.fuel import make_images

    with tempfile.TemporaryDirectory() as folder:
        listing = make_images(folder, 256, seed)
        gen = FuelGenerator(file_dir=folder, file_list=listing, dtype=["vuint8", "int64"])
        paths = [str(p) for p in gen.generate(f"{folder}/pack.h5", 16, 16, workers=0).paths]
        losses, seconds = {}, {}
        for name in names:
            started = time.perf_counter()
            # JAX is already imported here with one device: its workers are processes too.
            mv = Multiverse(universe, nworld, backend=name,
                            processes=nworld if name == "jax" else None)  # fmt: skip
            result = mv(paths, steps, 0.1, seed)
            losses[name], seconds[name] = result["losses"], time.perf_counter() - started
    title = f"Multiverse: {nworld} workers x {BATCH} rows a step"
    console.print(loss_table(title, "step", losses, rows=5))
    how = {"torch": "torch processes (gloo)", "jax": "JAX processes (jax.distributed)"}
    times = ", ".join(f"{nworld} {how[n]} {seconds[n]:.1f} s" for n in names)
    console.print(
        f"each step's loss is the mean over all {nworld * BATCH} rows; {times}, start-up and "
        "compiling included"
    )
    return {**{f"multiverse_{n}_losses": losses[n] for n in names}, "multiverse_nworld": nworld}
