"""Tank rows: a batch of numeric columns from a Tank against NumPy fancy indexing, per batch.

The pack: 100,000 rows of one float32 column ``x`` of shape (32,) and an int64 ``label``
(33 numbers a row), written with h5py as contiguous datasets. Per case, one batch:

- baseline: the arrays read whole into memory, rows taken by NumPy fancy indexing along a
  permutation (``x[rows], label[rows]``), then handed to the framework as the Tank does
  (``torch.from_numpy``; ``jnp.asarray``, labels as int32 under JAX);
- ours: ``Tank(pack, spec, batch, workers=0, to=...).next()``, epoch after epoch (the
  Tank reads the mapped pack file; it does not hold the arrays in memory).

Targets (issue #30): per batch at most NumPy's time plus 20 µs at 64 rows, and within 1.5x
of NumPy at 4,096 rows. The table's "over" column is ours minus the baseline, per batch.

    python benchmarks/bench_tank_rows.py [--threads 1] [--quick] [--targets numpy,torch,jax]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness

args = harness.parse_args("tank_rows")

import json  # noqa: E402
import tempfile  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402

from dualtrain.fuel import Tank  # noqa: E402

ROWS, FEATURES = 100_000, 32
BATCHES = (64, 4096)
TARGETS = ("numpy", "torch", "jax")


def write_pack(folder: str) -> str:
    rng = np.random.default_rng(0)
    path = f"{folder}/pack.h5"
    with h5py.File(path, "w") as f:
        f["x"] = rng.standard_normal((ROWS, FEATURES), dtype=np.float32)
        f["label"] = rng.integers(0, 10, ROWS)
        f.attrs["__fuel__"] = json.dumps({
            "format": "dualtrain.fuel", "version": 1, "count": ROWS, "keys": ["x", "label"],
            "columns": {"x": {"type": "float32", "kind": "value", "shape": [FEATURES]},
                        "label": {"type": "int64", "kind": "value", "shape": []}},
        })  # fmt: skip
    return path


def numpy_batches(path: str, batch: int, to: str):
    """A closure: the next batch by NumPy fancy indexing of the arrays read whole."""
    with h5py.File(path, "r") as f:
        x, label = f["x"][()], f["label"][()]
    if to == "jax":
        label = label.astype(np.int32)
    convert = _converter(to)
    order = np.random.default_rng(0).permutation(ROWS)
    starts = range(0, ROWS - batch + 1, batch)
    position = [0]

    def next_batch():
        start = starts[position[0] % len(starts)]
        position[0] += 1
        rows = order[start : start + batch]
        return convert(x[rows]), convert(label[rows])

    return next_batch


def _converter(to: str):
    if to == "torch":
        import torch

        harness.set_torch_threads(args.threads)
        return torch.from_numpy
    if to == "jax":
        import jax.numpy as jnp

        return jnp.asarray
    return lambda a: a


def main() -> None:
    targets = TARGETS[:1] if args.quick else TARGETS
    rows: list[harness.Row] = []
    with tempfile.TemporaryDirectory() as folder:
        path = write_pack(folder)
        for to in targets:
            spec = {"x": "float32", "label": "int32" if to == "jax" else "int64"}
            cast = "same_kind" if to == "jax" else "safe"
            for batch in BATCHES:
                plain = numpy_batches(path, batch, to)
                tank = Tank(path, spec, batch, seed=0, to=to, cast=cast)
                row = harness.compare(
                    f"{to}, {batch} rows a batch",
                    baseline=plain,
                    ours=tank.next,
                    baseline_name="NumPy fancy indexing",
                    quick=args.quick,
                )
                over_us = (row.ours.median - row.base.median) * 1e6
                row.extra["over"] = f"{over_us:+.1f} µs"
                row.extra["target"] = "+20 µs" if batch == 64 else ">= 0.67x"
                rows.append(row)
                tank.close()
    harness.report(
        "tank_rows",
        rows,
        args,
        rows_in_pack=ROWS,
        columns="x float32 (32,), label int64 (int32 under JAX, checked)",
        workers=0,
    )


if __name__ == "__main__":
    main()
