"""A small CNN trained from a Tank as one whole job: ``accelerate`` against the plain way.

    python benchmarks/jobs/ladder.py --framework torch --way ours

The job, every way alike: make 1,920 32x32 RGB images (4 classes, NumPy, fixed seed) as
PNG files in a temporary folder, pack them (``FuelGenerator.generate``, RAW encoding, so
serving costs no decode), serve them from a ``Tank`` (batches of 64, shuffled, seed 0,
``layout="NCHW"``, ``scale=1 / 255``, straight to torch tensors or JAX arrays) and train the
sweeps' CNN (`sweeps.torch_net` / `sweeps.jax_model`, ``"cnn"``) for 3 epochs of 30 batches
with Adam (lr 1e-3). Both ways read the same Tank batches; the pack making is part of both.

Ways:

- ``plain``: torch eager (``torch.optim.Adam(fused=True)``); JAX: the step under
  ``jax.jit``.
- ``ours``: torch: ``dualtrain_torch.accelerate(model)`` with its default ladder, the loop
  unchanged; JAX: ``dualtrain_jax.accelerate(step)`` in place of ``jax.jit(step)``.

The last stdout line is JSON: ``{"result": mean training loss of the last epoch, ...}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `jobs` when run as a script
from jobs import sweeps
from jobs.common import Job, script

ROWS = 1920  # 30 batches of 64
BATCH = 64
EPOCHS = 3
LR = 1e-3
SIDE = 32

# ---- the jobs ------------------------------------------------------------------------------


def _job(framework: str) -> Job:
    plain = "eager torch" if framework == "torch" else "jax.jit by hand"
    ours = "accelerate(model)" if framework == "torch" else "accelerate(step)"
    return Job(
        name="ladder/cnn/3x30",
        framework=framework,
        ways={w: script("ladder", "--framework", framework, "--way", w) for w in ("plain", "ours")},
        pairs=10,
        quick=True,
        tolerance=2e-2,  # a verified rung computes in another float order (channels-last...)
        note=f"CNN, 3 epochs of 30 Tank batches of 64, Adam; {ours} vs {plain}",
    )


JOBS: list[Job] = [_job("torch"), _job("jax")]

# ---- the job -------------------------------------------------------------------------------


def make_pack(folder: Path, rows: int = ROWS) -> list[str]:
    """Writes `rows` PNG images and their labels, packs them; returns the pack's paths.

    Class c adds its own colour to uniform noise, so the CNN has something to learn.
    """
    from PIL import Image

    from dualtrain import FuelGenerator

    rng = np.random.default_rng(sweeps.SEED)
    colours = rng.integers(-60, 60, (sweeps.CLASSES, 1, 1, 3))
    images = folder / "images"
    images.mkdir()
    lines = [["image", "label"]]
    for i in range(rows):
        label = int(rng.integers(0, sweeps.CLASSES))
        pixels = rng.integers(60, 196, (SIDE, SIDE, 3)) + colours[label]
        Image.fromarray(pixels.astype(np.uint8)).save(images / f"{i}.png")
        lines.append([f"{i}.png", str(label)])
    with open(folder / "list.csv", "w", newline="") as f:
        csv.writer(f).writerows(lines)
    gen = FuelGenerator(file_dir=str(images), file_list=str(folder / "list.csv"), dtype=["int64"])
    report = gen.generate(str(folder / "train.h5"), height=SIDE, width=SIDE, encode="RAW")
    return list(report.paths)


def _tank(paths: list[str], to: str) -> Any:
    from dualtrain import Tank

    label = "int64" if to == "torch" else "int32"  # JAX without x64 takes int32
    spec = {"image": "uint8", "label": label}
    return Tank(paths, spec, BATCH, seed=0, to=to, layout="NCHW", scale=1 / 255, cast="same_kind")


def _torch(paths: list[str], way: str) -> tuple[float, str]:
    import torch
    from torch.nn.functional import cross_entropy

    model = sweeps.torch_net("cnn")
    if way == "ours":
        from dualtrain_torch import accelerate

        model = accelerate(model)
    opt = torch.optim.Adam(model.parameters(), lr=LR, fused=True)
    tank = _tank(paths, "torch")
    losses: list[Any] = []
    for _ in range(EPOCHS):
        losses = []
        for batch in tank:  # one epoch: the pack holds exactly its batches
            loss = cross_entropy(model(batch["image"]), batch["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    tank.close()
    detail = model.forward.explain().summary() if way == "ours" else "eager"
    return float(torch.stack(losses).mean()), str(detail)


def _jax(paths: list[str], way: str) -> tuple[float, str]:
    import jax
    import jax.numpy as jnp
    import optax

    params, apply = sweeps.jax_model("cnn")
    tx = optax.adam(LR)

    def step(params: Any, opt_state: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        def loss_fn(p: Any) -> Any:
            return optax.softmax_cross_entropy_with_integer_labels(apply(p, x), y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    if way == "ours":
        from dualtrain_jax import accelerate

        fast = accelerate(step)
    else:
        fast = jax.jit(step)
    opt_state = tx.init(params)
    tank = _tank(paths, "jax")
    losses: list[Any] = []
    for _ in range(EPOCHS):
        losses = []
        for batch in tank:  # one epoch: the pack holds exactly its batches
            params, opt_state, loss = fast(params, opt_state, batch["image"], batch["label"])
            losses.append(loss)
    tank.close()
    detail = str(fast.explain().summary()) if way == "ours" else "jax.jit"
    return float(jnp.stack(losses).mean()), detail


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one CNN job from a Tank, one way")
    parser.add_argument("--framework", choices=sweeps.FRAMEWORKS, required=True)
    parser.add_argument("--way", choices=("plain", "ours"), required=True)
    parser.add_argument(
        "--steps", type=int, default=ROWS // BATCH, help="batches per epoch (tests: fewer)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= ROWS // BATCH:
        parser.error(f"--steps must be in [1, {ROWS // BATCH}]; got {args.steps}")
    start = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="dualtrain-ladder-"))
    try:
        paths = make_pack(folder, args.steps * BATCH)  # fewer steps: a smaller pack
        pack_s = time.perf_counter() - start
        run = _torch if args.framework == "torch" else _jax
        result, detail = run(paths, args.way)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = {
        "result": result,
        "framework": args.framework,
        "way": args.way,
        "steps": args.steps,
        "detail": detail,
        "pack_s": pack_s,
        "main_s": time.perf_counter() - start,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
