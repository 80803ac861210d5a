"""Multiverse: data-parallel training throughput against DDP and sharded jit written by hand.

Models: an MLP 784-512-512-10 (batch 64 per worker) and a small CNN (3x16x16 -> conv 16@3x3
pad 1 -> ReLU -> 2x2 max-pool -> 1024-10; batch 32 per worker); softmax cross-entropy, SGD
(lr 0.01). One step is forward, loss, backward, the gradients' all-reduce and the update.

torch (gloo on the CPU, one thread per worker):
- baseline, 1 worker: the plain loop (no process group); 2 workers: ``init_process_group``
  and ``DistributedDataParallel`` by hand, each worker stepping on its own batch.
- dualtrain: ``Multiverse(universe, n)``: ``mv.sync`` and ``mv.learner(...).step``.
JAX:
- one process over 1 and 4 host devices (``--xla_force_host_platform_device_count=4``):
  the baseline is ``jax.jit`` with ``NamedSharding`` (parameters replicated, the batch split
  over a "data" mesh axis) by hand; dualtrain is ``Multiverse(universe, n, backend="jax")``'s
  learner. The global batch is n x the per-worker batch.
- 2 processes joined by ``jax.distributed`` (one host device each): the same two, the
  baseline's processes joining by hand.

Every worker warms up, then times samples of steps; the median step time over the samples
of rank 0 is reported. Samples/s = the global batch / the step time. Scaling efficiency =
samples/s at n workers / (n x samples/s at 1 worker), from dualtrain's runs. Bytes
all-reduced per step = the gradients' bytes (every parameter's gradient once, float32).
The baseline's processes are started by Multiverse's launcher too (process start-up is not
timed); each run alternates baseline and dualtrain `--rounds` times.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

BATCH = {"mlp": 64, "cnn": 32}
WARMUP, SAMPLES, STEPS = 5, 7, 5  # per worker: warm-up steps, samples, steps per sample


def _craft(kind: str) -> Any:
    from dualtrain import dock
    from dualtrain.craft import Craft

    class MLP(Craft):
        def __init__(self) -> None:
            super().__init__("MLP")
            self.fc1, self.fc2, self.fc3 = (
                dock.Dense(784, 512), dock.Dense(512, 512), dock.Dense(512, 10)
            )  # fmt: skip

        def run(self, x: Any) -> Any:
            return self.fc3(dock.relu(self.fc2(dock.relu(self.fc1(x)))))

    class CNN(Craft):
        def __init__(self) -> None:
            super().__init__("CNN")
            self.conv = dock.Conv(3, 16, 3, padding=1)
            self.pool = dock.MaxPool(2)
            self.flat = dock.Flatten()
            self.fc = dock.Dense(16 * 8 * 8, 10)

        def run(self, x: Any) -> Any:
            return self.fc(self.flat(self.pool(dock.relu(self.conv(x)))))

    return MLP() if kind == "mlp" else CNN()


def _data(kind: str, rank: int, rows: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(rank)
    shape = (rows, 784) if kind == "mlp" else (rows, 3, 16, 16)
    return rng.normal(size=shape).astype(np.float32), rng.integers(0, 10, rows).astype(np.int32)


def _times(step: Any, sync: Any) -> list[float]:
    for _ in range(WARMUP):
        step()
    sync()
    out = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        sync()
        out.append((time.perf_counter() - start) / STEPS)
    return out


# ---- torch ------------------------------------------------------------------------------


def torch_universe(mv: Any, kind: str, way: str) -> dict[str, Any]:
    """One torch worker: `way` "baseline" (plain loop / DDP by hand) or "dualtrain"."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F  # noqa: N812

    import dualtrain_torch

    torch.set_num_threads(1)
    n, rank = mv.processes, mv.rank
    model = dualtrain_torch.realize(_craft(kind), seed=0)
    x, y = (torch.from_numpy(a) for a in _data(kind, rank, BATCH[kind]))
    y = y.long()
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if way == "dualtrain":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        learner = mv.learner(mv.sync(model), optimizer)
        times = _times(lambda: learner.step(x, y), lambda: None)
        mv.leave()
    else:
        if n > 1:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            dist.init_process_group("gloo", rank=rank, world_size=n)
            model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

        times = _times(step, lambda: None)
        if n > 1:
            # The DDP first: dropped after its group is destroyed, its reducer's teardown
            # joins gloo's threads while holding the GIL one of them waits for (a deadlock).
            del model, optimizer, step
            dist.destroy_process_group()
    return {"times": times, "grad_bytes": grad_bytes}


# ---- JAX --------------------------------------------------------------------------------


def jax_universe(mv: Any, kind: str, way: str) -> dict[str, Any]:
    """One JAX process: `way` "baseline" (sharded jit by hand) or "dualtrain"."""
    import jax
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import dualtrain_jax

    n = mv.nworld
    if way == "baseline" and mv.processes > 1:  # before anything computes (a JAX rule)
        jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], mv.processes, mv.rank)
    model = dualtrain_jax.realize(_craft(kind), seed=0)
    local = n // mv.processes
    x, y = _data(kind, mv.rank, BATCH[kind] * local)
    grad_bytes = sum(int(np.prod(p.shape)) * 4 for p in jax.tree.leaves(model.params))
    optimizer = optax.sgd(0.01)
    if way == "dualtrain":
        learner = mv.learner(mv.sync(model), optimizer)
        batch = mv.runtime.batch_device("jax")
        xs, ys = (jax.make_array_from_process_local_data(batch, a) for a in (x, y))
        out: list[Any] = []
        times = _times(lambda: out.append(learner.step(xs, ys)),
                       lambda: jax.block_until_ready(out[-1]) if out else None)  # fmt: skip
        mv.leave()
        return {"times": times, "grad_bytes": grad_bytes}
    devices = jax.devices()[:n]
    mesh = Mesh(np.array(devices), ("data",))
    replicated, split = NamedSharding(mesh, PartitionSpec()), NamedSharding(
        mesh, PartitionSpec("data")
    )  # fmt: skip
    host = jax.tree.map(np.asarray, (model, optimizer.init(model.params)))
    state = jax.tree.map(  # every process holds the whole (replicated) value
        lambda a: jax.make_array_from_callback(a.shape, replicated, lambda index: a[index]), host
    )
    xs, ys = (jax.make_array_from_process_local_data(split, a) for a in (x, y))

    def loss_fn(params: Any, module: Any, xb: Any, yb: Any) -> Any:
        logits, _ = module.apply(params, module.state, xb, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    @jax.jit
    def step(state: Any, xb: Any, yb: Any) -> Any:
        module, opt = state
        loss, grads = jax.value_and_grad(loss_fn)(module.params, module, xb, yb)
        updates, opt = optimizer.update(grads, opt, module.params)
        return (module.replace(params=optax.apply_updates(module.params, updates)), opt), loss

    holder = [state]

    def run() -> None:
        holder[0], _ = step(holder[0], xs, ys)

    times = _times(run, lambda: jax.block_until_ready(holder[0]))
    if mv.processes > 1:
        jax.distributed.shutdown()
    return {"times": times, "grad_bytes": grad_bytes}


# ---- the run ------------------------------------------------------------------------------


def _launch(universe: Any, n: int, kind: str, way: str, **kw: Any) -> dict[str, Any]:
    from dualtrain import Multiverse
    from dualtrain.multiverse.world import free_port

    if way != "baseline":
        return Multiverse(universe, n, **kw)(kind, way)
    # The launcher only starts the processes; the baseline joins by hand. Several JAX
    # processes are started as torch's (which join nothing until asked), since a JAX run
    # joins jax.distributed before its universe starts.
    processes = kw.get("processes", 1)
    if universe is jax_universe and processes > 1:
        return Multiverse(bare_jax, processes)(kind, way, f"127.0.0.1:{free_port()}")
    return Multiverse(_bare(universe), n, **kw)(kind, way)


def _bare(universe: Any) -> Any:
    return {"torch_universe": bare_torch, "jax_universe": bare_jax}[universe.__name__]


def bare_torch(mv: Any, kind: str, way: str) -> dict[str, Any]:
    """The baseline, started by the launcher: joins nothing through Multiverse."""
    return torch_universe(mv, kind, way)


def bare_jax(mv: Any, kind: str, way: str, coordinator: str = "") -> dict[str, Any]:
    """The baseline, started by the launcher: joins nothing through Multiverse."""
    if coordinator:  # one host device per process, as Multiverse gives its own processes
        os.environ["JAX_COORDINATOR_ADDRESS"] = coordinator
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1 " + " ".join(
            f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f
        )
    return jax_universe(mv, kind, way)


def main() -> None:
    import harness

    args = harness.parse_args("multiverse")
    # First: XLA stops reading XLA_FLAGS at the harness's bare thread-count token.
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4 " + os.environ.get(
        "XLA_FLAGS", ""
    )
    global SAMPLES
    if args.quick:
        SAMPLES = 3
    rounds = 1 if args.quick else 3
    rows: list[harness.Row] = []
    speed: dict[tuple[str, str, int], float] = {}
    plans = [("torch", kind, n, {}) for kind in BATCH for n in (1, 2)]
    plans += [("jax", kind, n, {"backend": "jax"}) for kind in BATCH for n in (1, 4)]
    plans += [("jax", kind, 2, {"backend": "jax", "processes": 2}) for kind in BATCH]
    for framework, kind, n, kw in plans:
        universe = torch_universe if framework == "torch" else jax_universe
        base: list[float] = []
        ours: list[float] = []
        grad_bytes = 0
        for _ in range(rounds):
            b = _launch(universe, n, kind, "baseline", **kw)
            o = _launch(universe, n, kind, "dualtrain", **kw)
            base += b["times"]
            ours += o["times"]
            grad_bytes = o["grad_bytes"]
        print(f"{framework} {kind} n={n} {kw}: measured", flush=True)
        procs = kw.get("processes", n if framework == "torch" else 1)
        label = f"{framework} {kind} {n} worker(s)" + (f", {procs} processes" if procs > 1 else "")
        batch = BATCH[kind] * n
        step = statistics.median(ours)
        speed[(framework + ("-procs" if procs > 1 and framework == "jax" else ""), kind, n)] = (
            batch / step
        )
        rows.append(harness.Row(
            label, "DDP by hand" if framework == "torch" and n > 1 else
            "plain loop" if framework == "torch" else "sharded jit by hand",
            harness._summary(base), harness._summary(ours),
            {"samples/s": f"{batch / step:.0f}", "global batch": batch,
             "MB all-reduced/step": f"{grad_bytes / 2**20:.2f}" if n > 1 else "0"},
        ))  # fmt: skip
    for row in rows:
        framework, kind, n = row.case.split()[0], row.case.split()[1], int(row.case.split()[2])
        key = (framework + ("-procs" if "processes" in row.case and framework == "jax" else ""),
               kind, n)  # fmt: skip
        one = speed.get((framework, kind, 1))
        if n > 1 and one:
            row.extra["scaling efficiency"] = f"{speed[key] / (n * one):.0%}"
    harness.report("multiverse", rows, args, batch_per_worker=BATCH, cpu_count=os.cpu_count())


if __name__ == "__main__":
    main()
