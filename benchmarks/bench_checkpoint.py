"""TimeMachine drop/load of a ~100M-parameter Craft against torch.save/load and raw safetensors.

The model: ten Dense(3200, 3200) layers (102.4M float32 parameters, 410 MB). Baselines, in
the same run, on the realized torch module: ``torch.save(state_dict)`` / ``torch.load`` +
``load_state_dict`` (and ``torch.load(mmap=True)``, which maps the file as an anchor is
mapped), and raw ``safetensors.torch.save_file`` / ``load_file`` + ``load_state_dict``.
TimeMachine also selects the neutral names, checks every shape against the model and
writes the manifest. Targets (#30): save within 1.2x of raw safetensors; load within 2x of
``torch.load(mmap=True)`` + ``load_state_dict``. Two like-for-like rows add to raw
safetensors what TimeMachine does beyond it: an fsync before the rename (drop), and the
same CRC-32C check of every 32 MiB chunk before any tensor is used, on the same cores
(load). The checksums use every core this process may use (reported as
``checksum_cores``); ``--threads`` sets torch's. Loading into JAX is compared with
``safetensors.flax.load_file``. Files go to a temporary folder on the same disk.

    ./dev bench checkpoint [--threads 1] [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness

args = harness.parse_args("checkpoint")

import crc32c  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import safetensors.flax  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402

from dualtrain import Craft, TimeMachine, dock  # noqa: E402
from dualtrain.checkpoint.anchor_file import CHUNK  # noqa: E402
from dualtrain_jax.craft import realize as jax_realize  # noqa: E402
from dualtrain_torch.craft import realize as torch_realize  # noqa: E402

harness.set_torch_threads(args.threads)

WIDTH, DEPTH = 3200, 10


class Big(Craft):
    def __init__(self):
        super().__init__("BIG")
        self.layers = [dock.Dense(WIDTH, WIDTH) for _ in range(DEPTH)]

    def run(self, x):
        for layer in self.layers:
            x = dock.relu(layer(x))
        return x


def durable_save(state, path):
    """Raw safetensors plus the fsync TimeMachine does before its rename."""
    safetensors.torch.save_file(state, path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


CORES = len(os.sched_getaffinity(0))


def checked_load(path):
    """Raw safetensors plus the CRC-32C of every 32 MiB chunk, on every core, as `to` does."""
    tensors = safetensors.torch.load_file(path)
    chunks = []
    for tensor in tensors.values():
        data = memoryview(tensor.numpy().reshape(-1).view(np.uint8))
        chunks += [data[at : at + CHUNK] for at in range(0, data.nbytes, CHUNK)]
    with ThreadPoolExecutor(CORES) as pool:
        list(pool.map(crc32c.crc32c, chunks))
    return tensors


def main():
    craft = Big()
    module = torch_realize(craft, seed=0)
    count = sum(p.numel() for p in module.parameters())
    folder = Path(tempfile.mkdtemp(dir=Path(__file__).parent))
    tm = TimeMachine(save_path=folder)
    paths = {k: folder / f"{k}.bin" for k in ("torch", "raw", "flax")}
    anchor = folder / "anchor.safetensors"
    rows = []
    try:
        # Both kinds of write once, then let the disk settle: otherwise the first measured row
        # absorbs the write-back of the warm-up files (seen: a 0.36-1.62 s spread).
        torch.save(module.state_dict(), paths["torch"])
        tm.drop(module, anchor)
        os.sync()
        rows.append(harness.compare(
            "drop (save) 102M params", baseline_name="torch.save",
            baseline=lambda: torch.save(module.state_dict(), paths["torch"]),
            ours=lambda: tm.drop(module, anchor), quick=args.quick, warmup=1,
        ))  # fmt: skip
        rows.append(harness.compare(
            "drop (save) 102M params", baseline_name="safetensors.torch.save_file",
            baseline=lambda: safetensors.torch.save_file(module.state_dict(), paths["raw"]),
            ours=lambda: tm.drop(module, anchor), quick=args.quick, warmup=1,
        ))  # fmt: skip
        rows.append(harness.compare(
            "drop (save) 102M params", baseline_name="save_file + fsync (like for like)",
            baseline=lambda: durable_save(module.state_dict(), paths["raw"]),
            ours=lambda: tm.drop(module, anchor), quick=args.quick, warmup=1,
        ))  # fmt: skip
        rows.append(harness.compare(
            "to (load) into torch", baseline_name="torch.load + load_state_dict",
            baseline=lambda: module.load_state_dict(torch.load(paths["torch"])),
            ours=lambda: tm.to(module, anchor, frozen=True), quick=args.quick, warmup=1,
        ))  # fmt: skip
        rows.append(harness.compare(
            "to (load) into torch", baseline_name="torch.load(mmap=True) + load_state_dict",
            baseline=lambda: module.load_state_dict(torch.load(paths["torch"], mmap=True)),
            ours=lambda: tm.to(module, anchor, frozen=True), quick=args.quick, warmup=1,
        ))  # fmt: skip
        rows.append(harness.compare(
            "to (load) into torch", baseline_name="safetensors load_file + load_state_dict",
            baseline=lambda: module.load_state_dict(safetensors.torch.load_file(paths["raw"])),
            ours=lambda: tm.to(module, anchor, frozen=True), quick=args.quick, warmup=1,
        ))  # fmt: skip
        rows.append(harness.compare(
            "to (load) into torch", baseline_name="load_file + CRC-32C + load (like for like)",
            baseline=lambda: module.load_state_dict(checked_load(paths["raw"])),
            ours=lambda: tm.to(module, anchor, frozen=True), quick=args.quick, warmup=1,
        ))  # fmt: skip
        jm = jax_realize(craft, seed=1)
        safetensors.flax.save_file(jm.params, paths["flax"])
        rows.append(harness.compare(
            "to (load) into JAX", baseline_name="safetensors.flax.load_file",
            baseline=lambda: jax.block_until_ready(safetensors.flax.load_file(paths["flax"])),
            ours=lambda: jax.block_until_ready(tm.to(jm, anchor, frozen=True) and jm.params),
            quick=args.quick, warmup=1,
        ))  # fmt: skip
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    for row in rows:
        row.extra["checksum_cores"] = CORES
    harness.report("checkpoint", rows, args, parameters=count, bytes=count * 4,
                   checksum_cores=CORES)  # fmt: skip


if __name__ == "__main__":
    main()
