"""A factorization recommender on embedding tables sharded across workers (docs/embeddings.md).

Ratings come from hidden user and item factors (rating = <user, item> + noise). Each worker
reads its own share of the ratings; the user table and the item table are EmbeddingStores
that ``mv.sync`` shards across the workers, so each worker holds 1/world of every table and
of Adam's state, and the rows a batch needs travel to it and back. Launch it on one host::

    python examples/recommender.py --backend torch --nworld 2        # Multiverse spawns 2
    torchrun --nproc-per-node 2 examples/recommender.py --backend torch
    python examples/recommender.py --backend jax --nworld 2           # jax.distributed

(docs/embeddings.md has the multi-host command lines.) Rank 0 prints the training loss and
the held-out RMSE once per epoch, and the final RMSE as JSON on its last line.

With ``--save DIR`` every worker writes its part of both tables (and Adam's state) to one
anchor set in DIR after each epoch, and a run started again resumes from it. To watch a
lost worker survived::

    python examples/recommender.py --save /tmp/rec --max-restarts 1 --fail-at 150

rank 1 kills itself (SIGKILL) at step 150 of the first attempt; the workers are started
again, load the last epoch's anchors and end where an uninterrupted run does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain import EmbeddingStore, Multiverse, TimeMachine


def ratings(users: int, items: int, count: int, dim: int, seed: int) -> tuple[np.ndarray, ...]:
    """`count` (user, item, rating) triples from hidden factors of rank `dim`, plus noise."""
    rng = np.random.default_rng(seed)
    hidden_u = rng.standard_normal((users, dim)) / dim**0.25
    hidden_i = rng.standard_normal((items, dim)) / dim**0.25
    # Popular items are rated more often, as in real logs (a Zipf-like draw).
    popularity = 1.0 / np.arange(1, items + 1) ** 0.8
    u = rng.integers(0, users, count)
    i = rng.choice(items, count, p=popularity / popularity.sum())
    r = np.einsum("nd,nd->n", hidden_u[u], hidden_i[i]) + 0.1 * rng.standard_normal(count)
    return u.astype(np.int64), i.astype(np.int64), r.astype(np.float32)


class Step:
    """One training step of the factorization model under the run's framework.

    The loss is the squared error summed over this worker's ratings and divided by the
    global batch: the stores add every worker's gradient of a row, so the run trains on the
    mean over the global batch, as one process would.
    """

    def __init__(self, backend: str, users: Any, items: Any, lr: float) -> None:
        self.backend = backend
        if backend == "torch":
            import torch

            from dualtrain_torch import attach

            self.users = attach(users, torch.optim.Adam, lr=lr)
            self.items = attach(items, torch.optim.Adam, lr=lr)
        else:
            import jax
            import optax

            from dualtrain_jax import attach

            self.users = attach(users, optax.adam(lr))
            self.items = attach(items, optax.adam(lr))

            def loss(u: Any, v: Any, r: Any, scale: float) -> Any:
                return (((u * v).sum(-1) - r) ** 2).sum() / scale

            self.value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    def __call__(self, u: np.ndarray, i: np.ndarray, r: np.ndarray, scale: float) -> float:
        """Steps both tables on ratings (u, i, r); returns this worker's share of the loss."""
        eu, ei = self.users.fetch(u), self.items.fetch(i)
        if self.backend == "torch":
            import torch

            loss = (((eu * ei).sum(-1) - torch.from_numpy(r)) ** 2).sum() / scale
            loss.backward()
            self.users.step()
            self.items.step()
            return float(loss.detach())
        value, (gu, gi) = self.value_and_grad(eu, ei, r, scale)
        self.users.step(gu)
        self.items.step(gi)
        return float(value)

    def rmse(self, u: np.ndarray, i: np.ndarray, r: np.ndarray) -> tuple[float, int]:
        """Squared error summed over held-out ratings, and their count (no step taken)."""
        eu, ei = self.users.fetch(u), self.items.fetch(i)
        product = (eu * ei).sum(-1)
        pred = product.detach().numpy() if self.backend == "torch" else np.asarray(product)
        self.users.release()  # fetched to read, not to train (every worker does the same)
        self.items.release()
        return float(((pred - r) ** 2).sum()), len(r)


def universe(mv: Multiverse, args: dict[str, Any]) -> dict[str, Any]:
    """One worker: its share of the ratings, its shard of both tables."""
    users = EmbeddingStore(args["users"], args["dim"], std=0.1, seed=1)
    items = EmbeddingStore(args["items"], args["dim"], std=0.1, seed=2)
    mv.sync((users, items))  # each worker now holds 1/world of both tables' rows
    u, i, r = ratings(args["users"], args["items"], args["ratings"], 8, seed=0)
    held = len(r) // 10  # the last tenth is held out
    train = np.arange(len(r) - held)
    mine = train[mv.rank :: mv.processes]  # this worker's share of the training ratings
    test = np.arange(len(r) - held, len(r))[mv.rank :: mv.processes]
    step = Step(mv.backend, users, items, args["lr"])
    batch = args["batch"]
    scale = float(batch * mv.processes)  # the global batch
    steps = len(mine) // batch
    steps = min(mv.runtime.gather_object(steps))  # every worker takes as many steps
    result: dict[str, Any] = {}
    first = 0
    tm = mv.time_machine(TimeMachine(save_path=args["save"])) if args["save"] else None
    if tm is not None and (Path(args["save"]) / "users.safetensors").exists():
        first = tm.to_embeddings(step.items, "items")["extra"]["epoch"] + 1
        tm.to_embeddings(step.users, "users")  # both written after the same epoch
        mv.print(f"attempt {mv.restart_count}: resuming after epoch {first - 1}")
    for epoch in range(first, args["epochs"]):
        # The order depends on (rank, epoch) only, so a resumed run sees what it would have.
        order = np.random.default_rng((100 + mv.rank, epoch)).permutation(mine)
        total = 0.0
        for k in range(steps):
            if epoch * steps + k == args["fail_at"] and mv.rank == 1 and mv.restart_count == 0:
                os.kill(os.getpid(), signal.SIGKILL)  # a lost worker (--fail-at)
            picked = order[k * batch : (k + 1) * batch]
            total += step(u[picked], i[picked], r[picked], scale)
        loss = mv.reduce(total / steps, aggregate=True)
        error, count = mv.reduce(step.rmse(u[test], i[test], r[test]), aggregate=True)
        result = {"epoch": epoch, "loss": loss, "rmse": (error / count) ** 0.5}
        mv.print(f"epoch {epoch}: loss {loss:.4f}, held-out RMSE {result['rmse']:.4f}")
        if tm is not None:  # every worker writes its rows; rank 0 the manifests, last
            tm.drop_embeddings(step.users, "users", extra={"epoch": epoch})
            tm.drop_embeddings(step.items, "items", extra={"epoch": epoch})
    result["rows_held"] = mv.runtime.gather_object(
        {"users": (users.rows.start, users.rows.stop), "items": (items.rows.start, items.rows.stop)}
    )
    return result


def main(argv: list[str] | None = None) -> None:
    """Parses the command line and runs the universe on `--nworld` workers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("torch", "jax"), default="torch")
    parser.add_argument("--nworld", type=int, default=2, help="workers (processes)")
    parser.add_argument("--users", type=int, default=4_000)
    parser.add_argument("--items", type=int, default=1_000)
    parser.add_argument("--ratings", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1024, help="ratings a worker a step")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--save", default=None, help="folder of the anchors (resumes from it)")
    parser.add_argument("--max-restarts", type=int, default=0, help="restarts after a failure")
    parser.add_argument("--fail-at", type=int, default=-1, help="rank 1 dies at this step once")
    ns = parser.parse_args(argv)
    options = {"processes": ns.nworld} if ns.backend == "jax" else {}
    mv = Multiverse(
        universe, ns.nworld, backend=ns.backend, max_restarts=ns.max_restarts, **options
    )
    result = mv(vars(ns))
    if mv.is_main:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
