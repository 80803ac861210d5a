"""Job (d): one epoch of batches from data the job writes, plain loaders against the Tank.

Every way makes its data file in a fresh temporary folder, reads one shuffled epoch of
batches of `--batch` (64) rows with 0 or 2 workers, and deletes the folder: the whole job
counts. `--kind`:

- ``tabular``: `--rows` (100,000) rows of 32 float32 features (one column ``x`` of shape
  (32,)) and an int64 label, N(0, 1) and 0..9 from NumPy seed 0, written with h5py as two
  contiguous datasets, ``x`` and ``label``. The plain ways write exactly that file; ours
  writes the same two datasets plus the pack's metadata attribute (``__fuel__``, the format
  in docs/fuel.md, "The format"), since FuelGenerator packs image lists only.
- ``images``: `--rows` (2,000) JPEGs of `--size` x `--size` (224) pixels, RGB, quality 90,
  made with Pillow, with labels i % 10. Every way writes the JPEG files; ours then packs
  them with ``FuelGenerator.generate(..., reencode=False)`` (each file already a 224x224
  RGB JPEG, so its bytes are stored as they are; as many threads as the loader has
  workers, at least 1), and decodes from the pack.

Ways (`--way`), each one process (`--workers` 0 or 2):

- ``plain``, torch: a ``DataLoader`` (shuffle, default collate, ``num_workers``) over a
  Dataset that holds its h5py datasets open (opened once per worker, never looked up per
  row), or that decodes each JPEG file with Pillow.
- ``plain``, JAX (the DataLoader is torch's): tabular, the arrays read whole and indexed
  by NumPy per batch (no workers, whatever `--workers`); images, a Pillow loop (0 workers)
  or a ``multiprocessing`` pool of 2 workers decoding a batch per task. Batches become
  JAX arrays with ``jnp.asarray``.
- ``numpy``, torch tabular: the arrays read whole and indexed by NumPy per batch.
- ``ours``: ``Tank(pack, ..., workers=n, to=framework, in_same_size=False)``.

Every way serves each row once (a short last batch), so the result is order-free:
``[sum of the labels, sum of feature 0 (tabular) or the mean pixel (images)]``. The pack
holds the JPEG files' own bytes, so every way decodes the same pixels.

    python benchmarks/jobs/tank.py --framework torch --way ours --kind images --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `jobs` when run as a script
from jobs.common import Job, script

FEATURES, CLASSES, SEED = 32, 10, 0

# ---- the jobs ------------------------------------------------------------------------------


def _job(framework: str, kind: str, workers: int) -> Job:
    ways = ["plain", "ours"]
    if framework == "torch" and kind == "tabular" and workers == 0:
        ways.append("numpy")
    plain = {
        ("torch", "tabular"): f"DataLoader({workers} workers) over h5py datasets held open",
        ("torch", "images"): f"DataLoader({workers} workers) decoding JPEGs with Pillow",
        ("jax", "tabular"): "NumPy indexing of the arrays read whole",
        ("jax", "images"): "a Pillow loop" if workers == 0 else "a 2-process Pillow pool",
    }[framework, kind]
    data = "100,000 rows x 32 float32 + label" if kind == "tabular" else "2,000 JPEGs 224x224"
    pack = "writes its HDF5 pack" if kind == "tabular" else "generate packs the JPEGs"
    args = ["--framework", framework, "--kind", kind, "--workers", str(workers)]
    return Job(
        name=f"tank/{kind}/{workers}w",
        framework=framework,
        ways={w: script("tank", "--way", w, *args) for w in ways},
        # Images: a sample takes 8-15 s here (making 2,000 JPEGs, packing them), so 5 pairs.
        pairs=10 if kind == "tabular" else 5,
        quick=False,
        # The same values, summed in another order (the pack holds the JPEG files' bytes).
        tolerance=1e-6,
        note=f"one epoch of {data}, batch 64; Tank ({pack}) vs {plain}"
        + ("" if kind == "tabular" else "; 5 pairs: 8-15 s a sample"),
    )


JOBS: list[Job] = [
    _job(framework, kind, workers)
    for framework in ("torch", "jax")
    for kind in ("tabular", "images")
    for workers in (0, 2)
]

# ---- the data ------------------------------------------------------------------------------


def write_tabular(folder: str, rows: int, pack: bool) -> str:
    """The h5py file of `rows` rows (``x`` (rows, 32) float32, ``label`` (rows,) int64)."""
    import h5py
    import numpy as np

    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((rows, FEATURES), dtype=np.float32)
    label = rng.integers(0, CLASSES, rows)
    path = os.path.join(folder, "pack.h5" if pack else "data.h5")
    with h5py.File(path, "w") as f:
        f["x"], f["label"] = x, label
        if pack:  # the pack format's metadata (docs/fuel.md, "The format")
            f.attrs["__fuel__"] = json.dumps({
                "format": "dualtrain.fuel", "version": 1, "count": rows,
                "keys": ["x", "label"],
                "columns": {"x": {"type": "float32", "kind": "value", "shape": [FEATURES]},
                            "label": {"type": "int64", "kind": "value", "shape": []}},
            })  # fmt: skip
    return path


def write_jpegs(folder: str, count: int, size: int) -> tuple[list[str], list[int]]:
    """`count` JPEGs (colour ramps with noise, quality 90) and their labels i % 10."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(SEED)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.uint8)
    # uint8 arithmetic wraps around: ramps of 7 slopes, then a shift and noise per image.
    ramps = np.stack([np.stack([xx * k + yy * (c + 1) for c in range(3)], -1) for k in range(1, 8)])
    noise = rng.integers(0, 16, (size + 64, size, 3), dtype=np.uint8)
    paths, labels = [], []
    for i in range(count):
        pixels = ramps[i % 7] + noise[i % 64 : i % 64 + size] + np.uint8(31 * i % 256)
        path = os.path.join(folder, f"{i}.jpg")
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
        labels.append(i % CLASSES)
    return paths, labels


def decode(path: str) -> Any:
    """One JPEG file as an (H, W, 3) uint8 array, by Pillow."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        return np.array(img.convert("RGB"))  # a writable copy, as torch wants


def decode_batch(paths: list[str]) -> Any:
    """A batch of JPEG files, stacked (B, H, W, 3) uint8 (a pool worker's task)."""
    import numpy as np

    return np.stack([decode(p) for p in paths])


# ---- the ways ------------------------------------------------------------------------------


def torch_plain_tabular(path: str, workers: int, batch: int) -> Iterator[tuple[Any, Any]]:
    """A DataLoader over a Dataset holding its h5py datasets open (once per worker)."""
    import h5py
    import torch

    class H5Rows(torch.utils.data.Dataset):
        def __init__(self) -> None:
            with h5py.File(path, "r") as f:
                self.rows = len(f["label"])
            self.x: Any = None
            self.label: Any = None

        def __len__(self) -> int:
            return self.rows

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            if self.x is None:  # in each worker, once: h5py handles do not cross a fork
                f = h5py.File(path, "r")
                self.x, self.label = f["x"], f["label"]
            return self.x[i], self.label[i]

    loader = torch.utils.data.DataLoader(
        H5Rows(), batch_size=batch, shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(SEED),
    )  # fmt: skip
    yield from loader


def torch_plain_images(paths: list[str], labels: list[int], workers: int, batch: int) -> Any:
    """A DataLoader over a Dataset decoding each JPEG file with Pillow."""
    import torch

    class Jpegs(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int) -> tuple[Any, int]:
            return decode(paths[i]), labels[i]

    loader = torch.utils.data.DataLoader(
        Jpegs(), batch_size=batch, shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(SEED),
    )  # fmt: skip
    yield from loader


def numpy_tabular(path: str, batch: int, to: str) -> Iterator[tuple[Any, Any]]:
    """The arrays read whole, one permutation, NumPy fancy indexing per batch."""
    import h5py
    import numpy as np

    with h5py.File(path, "r") as f:
        x, label = f["x"][()], f["label"][()]
    convert = _converter(to)
    order = np.random.default_rng(SEED).permutation(len(label))
    for start in range(0, len(order), batch):
        rows = order[start : start + batch]
        yield convert(x[rows]), convert(label[rows])


def jax_plain_images(paths: list[str], labels: list[int], workers: int, batch: int) -> Any:
    """A Pillow loop, or a pool of `workers` processes decoding one batch per task."""
    import numpy as np

    order = np.random.default_rng(SEED).permutation(len(paths))
    chunks = [[paths[i] for i in order[s : s + batch]] for s in range(0, len(order), batch)]
    label = np.asarray(labels)
    tags = [label[order[s : s + batch]] for s in range(0, len(order), batch)]
    if workers == 0:
        import jax.numpy as jnp

        for chunk, tag in zip(chunks, tags, strict=True):
            yield jnp.asarray(decode_batch(chunk)), jnp.asarray(tag)
        return
    import multiprocessing

    # Forked before JAX is imported: its threads never cross a fork.
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        import jax.numpy as jnp

        for images, tag in zip(pool.imap(decode_batch, chunks), tags, strict=True):
            yield jnp.asarray(images), jnp.asarray(tag)


def tank_batches(pack: str, spec: dict[str, str], workers: int, batch: int, to: str) -> Any:
    """One epoch of the Tank (each row once: a short last batch)."""
    from dualtrain import Tank

    cast = "same_kind" if to == "jax" else "safe"  # JAX without x64 takes int64 as int32
    if to == "jax":
        spec = {k: "int32" if v == "int64" else v for k, v in spec.items()}
    with Tank(pack, spec, batch, in_same_size=False, seed=SEED, workers=workers, to=to,
              cast=cast) as tank:  # fmt: skip
        for item in tank:
            yield tuple(item[k] for k in spec)


def _converter(to: str) -> Any:
    if to == "torch":
        import torch

        return torch.from_numpy
    import jax.numpy as jnp

    return jnp.asarray


# ---- the job -------------------------------------------------------------------------------


def run(
    framework: str, way: str, kind: str, workers: int, rows: int, size: int, batch: int
) -> list[float]:
    """Makes the data in a temporary folder, reads one epoch; [label sum, feature checksum]."""
    import numpy as np

    folder = tempfile.mkdtemp(prefix="dualtrain-job-tank-")
    try:
        if kind == "tabular":
            path = write_tabular(folder, rows, pack=way == "ours")
            if way == "ours":
                batches = tank_batches(path, {"x": "float32", "label": "int64"}, workers,
                                       batch, framework)  # fmt: skip
            elif way == "numpy" or framework == "jax":
                batches = numpy_tabular(path, batch, framework)
            else:
                batches = torch_plain_tabular(path, workers, batch)
        else:
            paths, labels = write_jpegs(folder, rows, size)
            if way == "ours":
                pack = _pack_images(folder, paths, labels, size, max(1, workers))
                batches = tank_batches(pack, {"image": "uint8", "label": "int64"}, workers,
                                       batch, framework)  # fmt: skip
            elif framework == "torch":
                batches = torch_plain_images(paths, labels, workers, batch)
            else:
                batches = jax_plain_images(paths, labels, workers, batch)
        label_sum, feature_sum, served = 0, 0.0, 0
        for values, label in batches:
            host = np.asarray(values)  # no copy: CPU torch tensors and JAX arrays
            label_sum += int(np.asarray(label).sum())
            served += len(host)
            feature_sum += float(host[:, 0].sum(dtype=np.float64) if kind == "tabular"
                                 else host.sum(dtype=np.int64))  # fmt: skip
        if served != rows:
            raise SystemExit(f"{way} served {served} rows of {rows}")
        if kind == "images":
            feature_sum /= rows * size * size * 3  # the mean pixel
        return [float(label_sum), feature_sum]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _pack_images(folder: str, paths: list[str], labels: list[int], size: int, threads: int) -> str:
    """The JPEGs' CSV list, packed by FuelGenerator into one HDF5 file (the files' bytes)."""
    import csv

    from dualtrain import FuelGenerator

    listing = os.path.join(folder, "list.csv")
    with open(listing, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "label"])
        writer.writerows([os.path.basename(p), str(t)] for p, t in zip(paths, labels, strict=True))
    gen = FuelGenerator(file_dir=folder, file_list=listing, dtype=["vuint8", "int64"])
    report = gen.generate(
        os.path.join(folder, "pack.h5"), size, size, workers=threads, reencode=False
    )
    return str(report.paths[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("torch", "jax"), required=True)
    parser.add_argument("--way", choices=("plain", "ours", "numpy"), required=True)
    parser.add_argument("--kind", choices=("tabular", "images"), required=True)
    parser.add_argument("--workers", type=int, choices=(0, 2), default=0)
    parser.add_argument("--rows", type=int, default=None,
                        help="rows (tabular, 100,000) or images (2,000)")  # fmt: skip
    parser.add_argument("--size", type=int, default=224, help="image side in pixels")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    rows = args.rows or (100_000 if args.kind == "tabular" else 2_000)
    if rows < 1 or args.batch < 1 or args.size < 8:
        parser.error("--rows >= 1, --batch >= 1 and --size >= 8")
    if args.way == "numpy" and (args.framework, args.kind) != ("torch", "tabular"):
        parser.error("--way numpy is torch's tabular baseline (JAX's plain way is NumPy)")
    result = run(args.framework, args.way, args.kind, args.workers, rows, args.size, args.batch)
    record = {"result": result, "framework": args.framework, "way": args.way,
              "kind": args.kind, "workers": args.workers, "rows": rows}  # fmt: skip
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
