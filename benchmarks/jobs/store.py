"""Job (e): training an embedding table, as a whole job, SparseAdam against the store.

A table of `--rows` (1,000,000) x `--dim` (128) float32 rows, `--steps` (200) steps of
`--ids` (8,192) ids drawn uniformly with replacement (NumPy seed 0, the same ids for every
way), a loss ``sum(e * G)`` with one fixed G (NumPy seed 1, N(0.5, 1), float32), Adam at
lr 1e-3. Each way builds its table the way it normally would, so the starting rows differ
(torch's N(0, 1) init against the store's seeded Philox rows of the same distribution); the
loss's gradient does not depend on the rows, so the result is init-free: the sum, over the
last step's looked-up ids, of how far each row moved (rows after the last step minus the
same rows before the first).

Ways (`--way`), each one process:

- ``plain``: ``nn.Embedding(rows, dim, sparse=True)`` + ``torch.optim.SparseAdam``, the
  plain baseline of both frameworks' stores (JAX has no sparse optimizer to compare with).
- ``ours``: ``EmbeddingStore(rows, dim, init="normal", std=1.0)`` with
  ``dualtrain_torch.attach(store, torch.optim.Adam, lr)`` or ``dualtrain_jax.attach(store,
  optax.adam(lr))`` (docs/embeddings.md, "The two calls"), lazy mode.

SparseAdam puts eps on √v rather than on √v̂ (docs/embeddings.md), so the ways agree to
about 1e-4 here, not to the last digit. The last stdout line is JSON ``{"result": ...}``.

    python benchmarks/jobs/store.py --framework jax --way ours
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `jobs` when run as a script
from jobs.common import Job, script

LR = 1e-3


def _job(framework: str) -> Job:
    return Job(
        name="store/1M-x-128/8192-ids",
        framework=framework,
        # The plain way is torch's under both frameworks: SparseAdam is the baseline.
        ways={
            "plain": script("store", "--framework", "torch", "--way", "plain"),
            "ours": script("store", "--framework", framework, "--way", "ours"),
        },
        pairs=5,
        quick=False,
        tolerance=1e-3,
        note=(
            f"1M x 128 table, 200 Adam steps of 8,192 ids; {framework} store vs "
            "nn.Embedding(sparse) + SparseAdam (5 pairs: a sample takes 10-20 s)"
        ),
    )


JOBS: list[Job] = [_job("torch"), _job("jax")]


def make_ids(rows: int, ids: int, steps: int) -> Any:
    """The ids of every step, (steps, ids) int64, uniform with replacement."""
    import numpy as np

    return np.random.default_rng(0).integers(0, rows, (steps, ids))


def make_grad(ids: int, dim: int) -> Any:
    """G, the loss's gradient with respect to the looked-up rows, (ids, dim) float32."""
    import numpy as np

    return np.random.default_rng(1).normal(0.5, 1.0, (ids, dim)).astype(np.float32)


def plain(rows: int, dim: int, ids: Any, grad: Any) -> float:
    """nn.Embedding(sparse=True) + SparseAdam; how far the last step's rows moved, summed."""
    import torch

    emb = torch.nn.Embedding(rows, dim, sparse=True)
    optimizer = torch.optim.SparseAdam(emb.parameters(), lr=LR)
    batches, g = torch.from_numpy(ids), torch.from_numpy(grad)
    last = batches[-1]
    before = float(emb.weight.detach()[last].double().sum())
    for batch in batches:
        optimizer.zero_grad()
        (emb(batch) * g).sum().backward()
        optimizer.step()
    return float(emb.weight.detach()[last].double().sum()) - before


def ours(framework: str, rows: int, dim: int, ids: Any, grad: Any) -> float:
    """The embedding store under `framework`; the same sum as `plain`."""
    import numpy as np

    import dualtrain

    store = dualtrain.EmbeddingStore(rows, dim, init="normal", std=1.0, seed=0)
    last = ids[-1]
    before = float(store.table[last].sum(dtype=np.float64))
    table: Any  # the torch or the JAX attachment
    if framework == "torch":
        import torch

        import dualtrain_torch

        table = dualtrain_torch.attach(store, torch.optim.Adam, lr=LR)
        g = torch.from_numpy(grad)
        for batch in ids:
            (table.fetch(batch) * g).sum().backward()
            table.step()
    else:
        import jax
        import optax

        import dualtrain_jax

        table = dualtrain_jax.attach(store, optax.adam(LR))
        g_jax = jax.numpy.asarray(grad)
        gradient = jax.jit(jax.grad(lambda e: (e * g_jax).sum()))
        for batch in ids:
            table.step(gradient(table.fetch(batch)))
    after = float(store.table[last].sum(dtype=np.float64))  # waits for the write-backs
    table.detach()
    return after - before


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("torch", "jax"), required=True)
    parser.add_argument("--way", choices=("plain", "ours"), required=True)
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows")
    parser.add_argument("--dim", type=int, default=128, help="row width")
    parser.add_argument("--ids", type=int, default=8192, help="ids a step")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    if min(args.rows, args.dim, args.ids, args.steps) < 1:
        parser.error("--rows, --dim, --ids and --steps must be >= 1")
    if args.way == "plain" and args.framework != "torch":
        parser.error("the plain way is torch's (nn.Embedding + SparseAdam): --framework torch")
    ids = make_ids(args.rows, args.ids, args.steps)
    grad = make_grad(args.ids, args.dim)
    if args.way == "plain":
        result = plain(args.rows, args.dim, ids, grad)
    else:
        result = ours(args.framework, args.rows, args.dim, ids, grad)
    record = {"result": result, "framework": args.framework, "way": args.way,
              "rows": args.rows, "ids": args.ids, "steps": args.steps}  # fmt: skip
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
