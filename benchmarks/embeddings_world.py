"""``bench_embeddings.py --world N``: one store sharded over 1, 2, 4, ... processes of one host.

Each run trains a [ROWS, DIM] float32 table under Adam (torch: ``torch.optim.Adam``, fused;
JAX: ``optax.adam``) with BATCH ids a process a step, drawn uniformly, every process on 1
thread. World 1 is the plain single-process store (``mv.sync`` does nothing in a run of one
process), the baseline each sharded run is held against. Per run and rank:

- steps/s: the run's step rate (its collectives keep the ranks in step), and the rows/s of
  the whole run (world x BATCH ids a step);
- memory: the store's bytes (table + Adam's two state tables) against 1/world of the
  unsharded store's, and the process's resident-set growth from before the store was made
  (its modules already imported); world 1 runs in the benchmark's own process, whose
  allocator reuses what earlier runs freed, so its growth reads low;
- exchange: seconds a step inside the three all-to-alls (waiting for peers included), and
  bytes sent a step against the bytes of the rows the step touches on other ranks.

Runs of each world size alternate, round after round. On a host of C cores, worlds above C
share cores: their step rate then measures the exchange plus contention, not scaling.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np

import dualtrain

LR = 1e-3


def _rss() -> int:
    """This process's resident set, in bytes (Linux /proc)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def universe(
    mv: dualtrain.Multiverse, framework: str, rows: int, dim: int, batch: int,
    warmup: int, steps: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """Trains a sharded store; returns every rank's measures (gathered to rank 0)."""
    # Everything a step imports, imported before the first measure: the growth is then the
    # store, its staging and the exchange's groups, not the modules.
    if framework == "torch":
        import torch

        import dualtrain_torch  # noqa: F401

        torch.set_num_threads(1)
    else:
        import jax
        import optax

        import dualtrain_jax  # noqa: F401
    before = _rss()
    store = dualtrain.EmbeddingStore(rows, dim, std=0.01, seed=0)
    mv.sync(store)
    rng = np.random.default_rng(1000 + mv.rank)
    batches = [rng.integers(0, rows, batch) for _ in range(warmup + steps)]
    weights = np.random.default_rng(1).standard_normal((batch, dim)).astype(np.float32)
    if framework == "torch":
        import torch

        from dualtrain_torch import attach

        table = attach(store, torch.optim.Adam, lr=LR)
        g = torch.from_numpy(weights)

        def step(ids: np.ndarray) -> None:
            (table.fetch(ids) * g).sum().backward()
            table.step()
    else:
        import jax
        import optax

        from dualtrain_jax import attach

        table = attach(store, optax.adam(LR))
        g = jax.numpy.asarray(weights)
        grad = jax.jit(jax.grad(lambda e: (e * g).sum()))

        def step(ids: np.ndarray) -> None:
            table.step(grad(table.fetch(ids)))

    for ids in batches[:warmup]:
        step(ids)
    table.flush()
    traffic = store.shard.traffic if store.shard is not None else None
    sent0, seconds0 = (traffic.sent, traffic.seconds) if traffic else (0, 0.0)
    mv.barrier() if mv.processes > 1 else None
    start = time.perf_counter()
    for ids in batches[warmup:]:
        step(ids)
    table.flush()
    elapsed = time.perf_counter() - start
    remote = 0  # rows a step touches that another rank owns (what must travel)
    for ids in batches[warmup:]:
        unique = np.unique(ids)
        remote += int(np.sum((unique < store.rows.start) | (unique >= store.rows.stop)))
    mine = {
        "rank": mv.rank,
        "step_s": elapsed / steps,
        "store_bytes": store.memory().total,
        "rss_growth": _rss() - before,
        "exchange_s": ((traffic.seconds - seconds0) / steps) if traffic else 0.0,
        "sent_per_step": ((traffic.sent - sent0) / steps) if traffic else 0.0,
        "remote_row_bytes_per_step": remote * dim * 4 / steps,
    }
    return mv.runtime.gather_object(mine) if mv.processes > 1 else [mine]


def run(framework: str, world: int, config: dict[str, int]) -> list[dict[str, Any]]:
    """One run of `world` processes (JAX: one process per device, joined)."""
    options = {"backend": "jax", "processes": world} if framework == "jax" else {}
    mv = dualtrain.Multiverse(universe, world, timeout=600, **options)
    return mv(framework, config["rows"], config["dim"], config["batch"], config["warmup"],
              config["steps"])  # fmt: skip


def measure(worlds: list[int], rounds: int, config: dict[str, int]) -> dict[tuple[str, int], list]:
    """Every (framework, world) run `rounds` times, alternating world sizes each round."""
    results: dict[tuple[str, int], list] = {}
    for r in range(rounds):
        order = worlds if r % 2 == 0 else worlds[::-1]
        for framework in ("torch", "jax"):
            for world in order:
                results.setdefault((framework, world), []).append(run(framework, world, config))
    return results


def summarize(results: dict[tuple[str, int], list], config: dict[str, int], timing: Any,
              row: Any) -> list[Any]:  # fmt: skip
    """The table's rows: each world against world 1 of its framework."""
    out = []
    whole = config["rows"] * config["dim"] * 4 * 3  # table + Adam's two moments
    for (framework, world), runs in sorted(results.items()):
        base_runs = results[(framework, 1)]
        per_step = [max(r["step_s"] for r in ranks) for ranks in runs]
        base_step = [max(r["step_s"] for r in ranks) for ranks in base_runs]
        last = runs[-1]
        extra = {
            "world": world,
            "rows/s (run)": f"{world * config['batch'] / statistics.median(per_step):,.0f}",
            "store MiB/rank": f"{max(r['store_bytes'] for r in last) / 2**20:.0f}",
            "1/world MiB": f"{whole / world / 2**20:.0f}",
            "RSS growth MiB/rank": f"{max(r['rss_growth'] for r in last) / 2**20:.0f}",
            "exchange ms/step": f"{statistics.median(r['exchange_s'] for r in last) * 1e3:.1f}",
            "sent KiB/step": f"{statistics.median(r['sent_per_step'] for r in last) / 1024:.0f}",
            "remote rows KiB/step": (
                f"{statistics.median(r['remote_row_bytes_per_step'] for r in last) / 1024:.0f}"
            ),
        }
        out.append(
            row(
                f"{framework} Adam, {world} process(es)",
                f"{framework}, 1 process",
                timing(base_step),
                timing(per_step),
                extra,
            )
        )
    return out


def worlds_up_to(n: int) -> list[int]:
    """1, 2, 4, ... up to `n` (and `n` itself)."""
    out, w = [], 1
    while w < n:
        out.append(w)
        w *= 2
    return sorted({*out, n})


def cores() -> int:
    return len(os.sched_getaffinity(0))
