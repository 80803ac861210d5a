"""Embedding store: the SpeedTorch workload against a contiguous copy and SparseAdam.

Tables of 1,000,000 and 131,072 rows x 128 float32; batches of 131,072 and 8,192 ids drawn
uniformly with replacement. In one run:

(a) row gather: the store's gather of a batch's unique rows into its staging buffer, in
    GB/s of rows moved, against a contiguous copy of the same bytes (target >= 60%); also
    the whole staging of a batch (id check + unique + gather);
(b) one full Adam step: fetch, a loss sum(e * G), backward, step, write-back (flushed),
    under torch (attach(store, torch.optim.Adam)) and JAX (attach(store, optax.adam)),
    against nn.Embedding(sparse=True) + torch.optim.SparseAdam doing the same (target
    >= 2.5x);
(c) host bytes per row of table + Adam state, against nn.Embedding + SparseAdam's.

With ``--device cuda`` (a GPU machine; JAX then needs ``JAX_PLATFORMS=cuda``), the stores
are pinned (``pinned=True``: rows staged in page-locked memory and trained on the GPU) and
the baseline is nn.Embedding(sparse) + SparseAdam with the whole table on the GPU; each
step ends with a device synchronisation.

With ``--world N`` it measures instead one store sharded over 1, 2, 4 ... N processes of
this host (``embeddings_world``: steps/s, memory a rank, the exchange's cost and bytes).

    ./dev bench embeddings [--threads 1] [--quick] [--device cpu|cuda] [--world N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness

_own = argparse.ArgumentParser(add_help=False)
_own.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
_own.add_argument("--world", type=int, default=0, help="shard over 1, 2, 4 ... N processes")
OWN, _rest = _own.parse_known_args()
if OWN.world < 0:
    _own.error(f"--world must be a positive number of processes; got {OWN.world}")
args = harness.parse_args("embeddings", _rest)

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402

import dualtrain  # noqa: E402
import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402
from dualtrain.embeddings import RowSession  # noqa: E402

harness.set_torch_threads(args.threads)
DEVICE = torch.device(OWN.device)
PINNED = DEVICE.type == "cuda"


def _sync() -> None:
    if PINNED:
        torch.cuda.synchronize(DEVICE)


DIM = 128
CONFIGS = [(131_072, 8_192), (131_072, 131_072)]
if not args.quick:
    CONFIGS = [(1_000_000, 131_072), (1_000_000, 8_192), *CONFIGS]
ROUNDS = 3 if args.quick else 5
LR = 1e-3


def _timing(seconds: list[float]) -> harness.Timing:
    return harness.Timing(statistics.median(seconds), min(seconds), max(seconds), len(seconds))


def _alternate(base, ours, rounds=ROUNDS, warmup=1):
    """Times two callables round-robin (a shared machine drifts); returns both timings."""
    for _ in range(warmup):
        base()
        ours()
    b, o = [], []
    for _ in range(rounds):
        for fn, out in ((base, b), (ours, o)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return _timing(b), _timing(o)


def gather_rows(rows: int, batch: int, ids: np.ndarray) -> list[harness.Row]:
    store = dualtrain.EmbeddingStore(rows, DIM, std=0.01, seed=0)
    session = RowSession(store, {}, "lazy")
    staged = session.begin((ids,))
    n = staged.size
    nbytes = n * DIM * 4
    src, dst = np.ones((n, DIM), np.float32), np.empty((n, DIM), np.float32)
    copy = lambda: np.copyto(dst, src)  # noqa: E731
    gb = lambda t: f"{nbytes / t.median / 1e9:.2f}"  # noqa: E731
    out = []
    for case, fn in (
        ("gather unique rows", lambda: session._gather(staged)),
        ("stage batch (check+unique+gather)", lambda: session.begin((ids,))),
    ):
        base, ours = _alternate(copy, fn, rounds=ROUNDS * 2, warmup=2)
        row = harness.Row(
            f"{case} R={rows:,} B={batch:,}",
            "contiguous copy",
            base,
            ours,
            {"unique": n, "GB/s": gb(ours), "copy GB/s": gb(base)},
        )
        row.extra["of copy"] = f"{row.ratio:.0%}"
        out.append(row)
    session.detach()
    return out


def adam_steps(rows: int, batch: int, ids: np.ndarray) -> tuple[list[harness.Row], dict]:
    g_host = torch.from_numpy(np.random.default_rng(1).standard_normal((batch, DIM), np.float32))
    g = g_host.to(DEVICE)
    ids_t = torch.from_numpy(ids)

    emb = torch.nn.Embedding(rows, DIM, sparse=True).to(DEVICE)
    sparse = torch.optim.SparseAdam(emb.parameters(), lr=LR)
    ids_d = ids_t.to(DEVICE)

    def baseline():
        sparse.zero_grad()
        (emb(ids_d) * g).sum().backward()
        sparse.step()
        _sync()

    t_store = dualtrain.EmbeddingStore(rows, DIM, std=0.01, seed=0, pinned=PINNED)
    t_rows = dualtrain_torch.attach(t_store, torch.optim.Adam, lr=LR)

    def torch_step():
        (t_rows.fetch(ids_t) * g).sum().backward()
        t_rows.step()
        t_rows.flush()
        _sync()

    j_store = dualtrain.EmbeddingStore(rows, DIM, std=0.01, seed=0)
    j_rows = dualtrain_jax.attach(j_store, optax.adam(LR))
    g_j = jnp.asarray(g_host.numpy())
    grad = jax.jit(jax.grad(lambda e: (e * g_j).sum()))

    def jax_step():
        j_rows.step(grad(j_rows.fetch(ids)))
        j_rows.flush()

    out = []
    for name, fn in (("torch", torch_step), ("JAX", jax_step)):
        base, ours = _alternate(baseline, fn)
        out.append(
            harness.Row(
                f"Adam step, {name} R={rows:,} B={batch:,}",
                "nn.Embedding(sparse) + SparseAdam",
                base,
                ours,
                {"unique": int(np.unique(ids).size)},
            )
        )
    sparse_state = sum(
        v.nbytes for s in sparse.state.values() for v in s.values() if torch.is_tensor(v)
    )
    memory = {
        "rows": rows,
        "store bytes/row": t_store.memory().per_row,
        "nn.Embedding + SparseAdam bytes/row": (emb.weight.nbytes + sparse_state) / rows,
    }
    t_rows.detach()
    j_rows.detach()
    return out, memory


def world_main() -> None:
    """--world N: the sharded store over 1, 2, 4 ... N processes (see embeddings_world)."""
    import embeddings_world as world

    if args.json == harness.RESULTS / "embeddings.json":  # not named: its own file
        args.json = harness.RESULTS / "embeddings_world.json"
    config = {"rows": 200_000 if args.quick else 1_000_000, "dim": 64, "batch": 8_192,
              "warmup": 3, "steps": 10 if args.quick else 30}  # fmt: skip
    rounds = 2 if args.quick else 3
    worlds = world.worlds_up_to(OWN.world)
    results = world.measure(worlds, rounds, config)
    rows_out = world.summarize(results, config, _timing, harness.Row)
    harness.report(
        "embeddings_world", rows_out, args, config=config, rounds=rounds, worlds=worlds,
        cores=world.cores(), torch=torch.__version__, jax=jax.__version__,
    )  # fmt: skip


def main() -> None:
    if OWN.world:
        world_main()
        return
    rows_out, memory = [], []
    for rows, batch in CONFIGS:
        ids = np.random.default_rng(0).integers(0, rows, batch)
        rows_out += gather_rows(rows, batch, ids)
        steps, mem = adam_steps(rows, batch, ids)
        rows_out += steps
        memory.append(mem)
    for m in memory:
        print(
            f"(c) R={m['rows']:,}: store {m['store bytes/row']:.0f} B/row, "
            f"nn.Embedding + SparseAdam {m['nn.Embedding + SparseAdam bytes/row']:.0f} B/row"
        )
    harness.report(
        "embeddings",
        rows_out,
        args,
        dim=DIM,
        lr=LR,
        rounds=ROUNDS,
        host_bytes_per_row=memory,
        device=OWN.device,
        torch=torch.__version__,
        jax=jax.__version__,
    )


if __name__ == "__main__":
    main()
