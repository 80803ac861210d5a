"""Job (c): data-parallel training of an MLP, as a whole job, plain against Multiverse.

An MLP 784-256-10 (ReLU), softmax cross-entropy, Adam (lr 1e-3), `--steps` steps (300) of a
global batch of `--batch` rows (64), on data the job makes: 4,096 rows of N(0, 1) features
labelled by a random linear teacher, served in order, batch after batch. Every way starts
from the same weights (drawn with NumPy, seed 1, torch's default ranges) and sees the same
global batches, so every way ends at the same loss up to float rounding. With 2 workers
each takes its half of every global batch (32 rows each): the same sums, split.

Ways (`--way`), each launched whole by its argv (process start-up counted):

- torch, 1 worker: plain = the usual loop in this process; ours = ``Multiverse(universe, 1)``
  (``mv.sync``, ``mv.learner``), which runs in this process too.
- torch, 2 workers: plain = ``DistributedDataParallel`` by hand (gloo) under ``torchrun
  --standalone --nproc-per-node 2``; ours = ``Multiverse(universe, 2)``, which spawns its 2
  workers (docs/multiverse.md, "Launching").
- JAX, 1 worker: plain = a ``jax.jit`` step with optax; ours = ``Multiverse(universe, 1,
  backend="jax")``.
- JAX, 2 workers: plain = 2 processes started by this script (``subprocess``, a free port on
  127.0.0.1), joined by ``jax.distributed.initialize`` and stepping one sharded ``jit``
  written by hand; ours = ``Multiverse(universe, 2, backend="jax", processes=2)``.

The last stdout line is JSON: ``{"result": final loss, ...}`` (the last step's loss, the
mean over the global batch).

    python benchmarks/jobs/multiverse.py --framework torch --way ours --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `jobs` when run as a script
from jobs.common import PYTHON, Job, script

ROWS, FEATURES, HIDDEN, CLASSES = 4096, 784, 256, 10
LR = 1e-3

# ---- the jobs ------------------------------------------------------------------------------


def _argv(framework: str, way: str, workers: int) -> list[str]:
    args = ["--framework", framework, "--way", way, "--workers", str(workers)]
    if framework == "torch" and way == "plain" and workers > 1:
        # torchrun itself: its module under this Python (the `torchrun` entry point).
        launcher = [PYTHON, "-m", "torch.distributed.run", "--standalone"]
        return [*launcher, "--nproc-per-node", str(workers), *script("multiverse", *args)[1:]]
    return script("multiverse", *args)


def _job(framework: str, workers: int) -> Job:
    plain = {
        ("torch", 1): "the plain loop",
        ("torch", 2): "DDP by hand under torchrun",
        ("jax", 1): "jax.jit by hand",
        ("jax", 2): "sharded jit over 2 jax.distributed processes by hand",
    }[framework, workers]
    return Job(
        name=f"multiverse/mlp/{workers}w",
        framework=framework,
        ways={w: _argv(framework, w, workers) for w in ("plain", "ours")},
        # 2 workers: a sample takes 15-20 s here (4-5 processes importing torch or JAX).
        pairs=10 if workers == 1 else 5,
        quick=False,
        tolerance=1e-3,
        note=f"MLP 784-256-10, Adam, 300 steps of 64 rows; Multiverse vs {plain}"
        + ("" if workers == 1 else "; 5 pairs: 15-20 s a sample"),
    )


JOBS: list[Job] = [_job(f, n) for f in ("torch", "jax") for n in (1, 2)]

# ---- the data and the weights, alike for every way -----------------------------------------


def make_data() -> tuple[Any, Any]:
    """Features (ROWS, 784) float32 and labels (ROWS,) int32 from a random linear teacher."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, FEATURES), dtype=np.float32)
    teacher = rng.standard_normal((FEATURES, CLASSES), dtype=np.float32)
    return x, np.argmax(x @ teacher, axis=1).astype(np.int32)


def make_weights() -> dict[str, Any]:
    """The starting weights, torch's layout (out, in) and default range U(-1/√in, 1/√in)."""
    import numpy as np

    rng = np.random.default_rng(1)
    out: dict[str, Any] = {}
    for name, (n_in, n_out) in (("fc1", (FEATURES, HIDDEN)), ("fc2", (HIDDEN, CLASSES))):
        bound = 1 / np.sqrt(n_in)
        out[f"{name}.weight"] = rng.uniform(-bound, bound, (n_out, n_in)).astype(np.float32)
        out[f"{name}.bias"] = rng.uniform(-bound, bound, n_out).astype(np.float32)
    return out


def rows_of(step: int, batch: int, rank: int, workers: int) -> slice:
    """The rows of global batch `step` that worker `rank` of `workers` trains on."""
    start = (step * batch) % ROWS
    local = batch // workers
    return slice(start + rank * local, start + (rank + 1) * local)


def _craft() -> Any:
    from dualtrain import Craft, dock

    class MLP(Craft):
        def __init__(self) -> None:
            super().__init__("MLP")
            self.fc1 = dock.Dense(FEATURES, HIDDEN)
            self.fc2 = dock.Dense(HIDDEN, CLASSES)

        def run(self, x: Any) -> Any:
            return self.fc2(dock.relu(self.fc1(x)))

    return MLP()


# ---- torch ---------------------------------------------------------------------------------


def torch_plain(steps: int, batch: int) -> float:
    """The plain loop (1 worker), or one DDP worker of a torchrun launch (2 workers)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F  # noqa: N812

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    model: Any = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(FEATURES, HIDDEN))
    model.add_module("relu", torch.nn.ReLU())
    model.add_module("fc2", torch.nn.Linear(HIDDEN, CLASSES))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in make_weights().items()})
    if world > 1:
        dist.init_process_group("gloo")  # torchrun's MASTER_ADDR (127.0.0.1), RANK, WORLD_SIZE
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    x, y = make_data()
    xs, ys = torch.from_numpy(x), torch.from_numpy(y).long()
    loss = torch.zeros(())
    for step in range(steps):
        rows = rows_of(step, batch, rank, world)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xs[rows]), ys[rows])
        loss.backward()
        optimizer.step()
    final = loss.detach()
    if world > 1:
        dist.all_reduce(final)  # the global batch's mean: the ranks' means averaged
        value = float(final) / world
        # gloo's thread drops `final` after all_reduce has returned, taking the GIL; one still
        # doing so when Python finalizes aborts the process (SIGABRT, "terminate called
        # without an active exception"; docs/multiverse.md). A careful script waits for it.
        held = weakref.ref(final)
        del final
        # The DDP first: dropped after its group, its reducer's teardown can deadlock on gloo.
        del model, optimizer
        dist.destroy_process_group()
        deadline = time.monotonic() + 10.0
        while held() is not None and time.monotonic() < deadline:
            time.sleep(0.001)  # the GIL free
        return value
    return float(final)


def torch_universe(mv: Any, steps: int, batch: int) -> float:
    """One Multiverse worker under torch."""
    import torch

    import dualtrain_torch

    model = dualtrain_torch.realize(_craft(), seed=0)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in make_weights().items()})
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    learner = mv.learner(mv.sync(model), optimizer)
    x, y = make_data()
    xs, ys = torch.from_numpy(x), torch.from_numpy(y).long()
    loss = torch.zeros(())
    for step in range(steps):
        rows = rows_of(step, batch, mv.rank, mv.nworld)
        loss = learner.step(xs[rows], ys[rows])
    return float(loss)


# ---- JAX -----------------------------------------------------------------------------------


def jax_plain(
    steps: int, batch: int, rank: int = 0, processes: int = 1, coordinator: str = ""
) -> float:
    """``jax.jit`` by hand: one process, or process `rank` of a jax.distributed run."""
    import jax

    if processes > 1:  # before anything computes with JAX
        jax.distributed.initialize(coordinator, processes, rank)
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    def loss_fn(params: Any, xb: Any, yb: Any) -> Any:
        h = jax.nn.relu(xb @ params["fc1.weight"].T + params["fc1.bias"])
        logits = h @ params["fc2.weight"].T + params["fc2.bias"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    optimizer = optax.adam(LR)

    @jax.jit
    def step(params: Any, opt_state: Any, xb: Any, yb: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    weights = make_weights()
    x, y = make_data()
    place: Callable[[Any], Any]
    if processes == 1:
        params = jax.tree.map(jax.numpy.asarray, weights)
        place = lambda a: a  # noqa: E731  (jit takes the NumPy rows as they are)
    else:
        mesh = Mesh(np.array(jax.devices()), ("data",))
        replicated = NamedSharding(mesh, PartitionSpec())
        split = NamedSharding(mesh, PartitionSpec("data"))

        def replicate(value: Any) -> Any:  # every process holds the whole value
            return jax.make_array_from_callback(value.shape, replicated, value.__getitem__)

        params = {k: replicate(v) for k, v in weights.items()}
        place = lambda a: jax.make_array_from_process_local_data(split, a)  # noqa: E731
    opt_state = optimizer.init(params)
    loss = None
    for i in range(steps):
        rows = rows_of(i, batch, rank, processes)
        params, opt_state, loss = step(params, opt_state, place(x[rows]), place(y[rows]))
    final = float(loss) if loss is not None else 0.0
    if processes > 1:
        jax.distributed.shutdown()
    return final


def jax_universe(mv: Any, steps: int, batch: int) -> float:
    """One Multiverse process under JAX (its rows: its share of the global batch)."""
    import jax

    import dualtrain_jax

    model = dualtrain_jax.realize(_craft(), seed=0)
    model = model.replace(params={k: jax.numpy.asarray(v) for k, v in make_weights().items()})
    import optax

    learner = mv.learner(mv.sync(model), optax.adam(LR))
    x, y = make_data()
    loss = None
    for step in range(steps):
        rows = rows_of(step, batch, mv.rank, mv.processes)
        loss = learner.step(x[rows], y[rows])
    return float(loss) if loss is not None else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def jax_plain_launch(steps: int, batch: int, workers: int) -> float:
    """Starts `workers` processes of this script joined by jax.distributed; rank 0's loss."""
    coordinator = f"127.0.0.1:{_free_port()}"
    base = [PYTHON, __file__, "--framework", "jax", "--way", "plain", "--workers", str(workers),
            "--steps", str(steps), "--batch", str(batch), "--coordinator", coordinator]  # fmt: skip
    with tempfile.TemporaryFile() as out:
        procs = [
            subprocess.Popen([*base, "--rank", str(r)], stdout=out if r == 0 else None)
            for r in range(workers)
        ]
        try:
            # A worker that fails leaves its peers waiting in a collective: stop them then.
            while any(p.poll() is None for p in procs):
                if any(p.returncode for p in procs):
                    break
                time.sleep(0.01)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        codes = [p.returncode for p in procs]
        if any(codes):
            raise SystemExit(f"a JAX worker failed: exit codes {codes}")
        out.seek(0)
        text = out.read()
    return float(json.loads(text.decode().strip().splitlines()[-1])["result"])


# ---- the command line ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("torch", "jax"), required=True)
    parser.add_argument("--way", choices=("plain", "ours"), required=True)
    parser.add_argument("--workers", type=int, choices=(1, 2), default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64, help="global batch (rows a step)")
    parser.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)  # JAX plain
    parser.add_argument("--coordinator", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or ROWS % args.batch or args.batch % args.workers:
        parser.error(f"--steps >= 1, --batch dividing {ROWS} and a multiple of --workers")
    n, fw = args.workers, args.framework
    if args.way == "ours":
        from dualtrain import Multiverse

        universe = torch_universe if fw == "torch" else jax_universe
        kw: dict[str, Any] = {} if fw == "torch" else {"backend": "jax", "processes": n}
        loss = Multiverse(universe, n, **kw)(args.steps, args.batch)
    elif fw == "torch":
        loss = torch_plain(args.steps, args.batch)
        if int(os.environ.get("RANK", "0")) != 0:
            return  # rank 0 alone prints the result
    elif n == 1:
        loss = jax_plain(args.steps, args.batch)
    elif args.rank < 0:
        loss = jax_plain_launch(args.steps, args.batch, n)
    else:
        loss = jax_plain(args.steps, args.batch, args.rank, n, args.coordinator)
        if args.rank != 0:
            return
    record = {"result": loss, "framework": fw, "way": args.way, "workers": n,
              "steps": args.steps, "batch": args.batch}  # fmt: skip
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
