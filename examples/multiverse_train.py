"""Data-parallel training of one Craft from a Tank, under torch or JAX (docs/multiverse.md).

The same script runs on one worker or many, launched any of these ways::

    python examples/multiverse_train.py --backend torch --nworld 2    # Multiverse spawns 2
    torchrun --nproc-per-node 2 examples/multiverse_train.py --backend torch
    python examples/multiverse_train.py --backend jax --nworld 2 --processes 2  # jax.distributed
    python examples/multiverse_train.py --backend jax --nworld 4      # 1 process, 4 devices

It makes its own data (PNG images of four classes, packed with FuelGenerator), trains a small
CNN with SGD for a few epochs, prints the loss averaged over the workers once per epoch (rank
0 only) and drops a checkpoint per epoch (rank 0 writes it, every rank can load it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import dualtrain
from dualtrain import Craft, FuelGenerator, Multiverse, Tank, TimeMachine, dock
from dualtrain.demo.fuel import make_images


class SmallCNN(Craft):
    """Conv 3->8, ReLU, 2x2 max-pool, then a Dense classifier of 16x16x3 images (NCHW)."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__("CNN")
        self.conv = dock.Conv(3, 8, 3, padding=1)
        self.pool = dock.MaxPool(2)
        self.flat = dock.Flatten()
        self.fc = dock.Dense(8 * 8 * 8, classes)

    def run(self, x: Any) -> Any:
        return self.fc(self.flat(self.pool(dock.relu(self.conv(x)))))


def make_pack(folder: Path, seed: int, rows: int = 256) -> list[str]:
    """`rows` images and their CSV in `folder`, packed once; the pack's shard paths."""
    listing = make_images(str(folder), rows, seed)
    gen = FuelGenerator(file_dir=str(folder), file_list=listing, dtype=["vuint8", "int64"])
    return [str(p) for p in gen.generate(str(folder / "pack.h5"), 16, 16, shards=2).paths]


def framework(backend: str, lr: float) -> tuple[Any, Any]:
    """The backend's realize and an SGD optimizer factory (model -> optimizer)."""
    if backend == "torch":
        import torch

        import dualtrain_torch

        return dualtrain_torch.realize, lambda model: torch.optim.SGD(model.parameters(), lr)
    import optax

    import dualtrain_jax

    return dualtrain_jax.realize, lambda model: optax.sgd(lr)


def universe(mv: Multiverse, out: str | None, epochs: int, batch: int, lr: float, seed: int) -> Any:
    """One worker's training: the same code on every worker and under either backend."""
    mv.init()
    # Every worker uses rank 0's folder (under torchrun each process parsed its own --out).
    mine = out or (tempfile.mkdtemp(prefix="multiverse-") if mv.is_main else None)
    folder = Path(mv.runtime.gather_object(mine)[0])
    if mv.is_main:  # one process writes the data; the others wait for it
        paths = make_pack(folder, seed)
        (folder / "pack.json").write_text(json.dumps(paths))
    mv.barrier()
    paths = json.loads((folder / "pack.json").read_text())
    realize, make_optimizer = framework(mv.backend, lr)
    label = "int64" if mv.backend == "torch" else "int32"
    rows = batch * mv.runtime.local_devices  # this process's rows: `batch` per device
    tank = Tank(paths, {"image": "uint8", "label": label}, rows, seed=seed, to=mv.backend,
                layout="NCHW", scale=1 / 255, cast="same_kind", drop_last=True)  # fmt: skip
    model = realize(SmallCNN(), seed=seed)  # the same weights everywhere; sync checks it
    optimizer = make_optimizer(model)
    model = mv.sync(model, tank)  # DDP, or replicated over the mesh; the Tank sharded per rank
    learner = mv.learner(model, optimizer)
    anchors = mv.time_machine(TimeMachine(save_path=folder / "ckpt", max_anchors=2))
    mv.seed(seed)
    losses = []
    for epoch in range(epochs):
        total = 0.0
        for item in tank:
            total += float(learner.step(item["image"], item["label"]))
        loss = mv.reduce(total / tank.MPE)  # this epoch's mean loss over every worker
        losses.append(loss)
        anchor = anchors.drop(learner.model, step=learner.steps, extra={"epoch": epoch})
        mv.print(f"epoch {epoch}: loss {loss:.4f} over {mv.nworld} workers -> {anchor.name}")
    tank.close()
    return {"losses": losses, "nworld": mv.nworld, "steps": learner.steps}


def main(argv: list[str] | None = None) -> Any:
    """Parses the command line and runs `universe` on the workers; rank 0's result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("torch", "jax"), default="torch")
    parser.add_argument("--nworld", type=int, default=2, help="data-parallel workers")
    parser.add_argument("--processes", type=int, default=None, help="JAX: processes")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="rows per worker (device) and step")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="folder for data and checkpoints "
                        "(default: a new temporary folder)")  # fmt: skip
    args = parser.parse_args(argv)
    mv = dualtrain.Multiverse(universe, args.nworld, backend=args.backend,
                              processes=args.processes)  # fmt: skip
    result = mv(args.out, args.epochs, args.batch, args.lr, args.seed)
    if mv.is_main:  # the launching process, or rank 0 under torchrun
        print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
