"""Per-call overhead: what a dualtrain wrapper adds to one call of a tiny model, in µs.

Each row calls a tiny computation (so the call's own cost is visible) through dualtrain and
the hand-written way, alternating samples (`harness.compare`), after the ladder's decision
is final (the steady-time watch included). "over" is ours minus the baseline, per call.

- JAX, ``accelerate(fn)`` against ``jax.jit(fn)``: a tiny MLP's loss (3 weights, 4 rows of
  8) and a train step of it (loss, gradient and an SGD update; params in a dict);
- torch, ``accelerate(model)`` against the same ``nn.Sequential`` called eagerly (64-64-4,
  batch 32, no gradient); and a realized Craft's eager forward against the
  ``nn.Sequential`` of the same layers.

Targets (issue #30): <= 5 µs a call over ``jax.jit``, <= 2 µs over eager torch.

    python benchmarks/bench_call_overhead.py [--threads 1] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness

args = harness.parse_args("call_overhead")

import math  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

# A fresh decision cache: the ladder decides here, in this run.
os.environ["DUALTRAIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="dualtrain-bench-")

SETTLE = 60  # calls after which every decision here is final (26 watched, margin to spare)


def settle(fn, *a):
    for _ in range(SETTLE):
        fn(*a)


def jax_rows() -> list[harness.Row]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dualtrain_jax import accelerate

    rng = np.random.default_rng(0)
    params = {
        "w1": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
        "w2": jnp.asarray(rng.normal(size=(16, 16)), jnp.float32),
        "w3": jnp.asarray(rng.normal(size=(16, 2)), jnp.float32),
    }
    x = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)

    def loss(p, x):
        h = jnp.tanh(x @ p["w1"])
        h = jnp.tanh(h @ p["w2"])
        return jnp.mean((h @ p["w3"]) ** 2)

    def step(p, x):
        value, grads = jax.value_and_grad(loss)(p, x)
        return jax.tree_util.tree_map(lambda w, g: w - 0.01 * g, p, grads), value

    def threaded(fn, first):
        """A call of `fn` on the params the last call returned (a step may donate them)."""
        held = [jax.tree_util.tree_map(jnp.copy, first)]

        def call():
            out = fn(held[0], x)
            if isinstance(out, tuple):
                held[0] = out[0]
            return out

        return call

    rows = []
    for name, fn in (("loss", loss), ("train step", step)):
        plain = threaded(jax.jit(fn), params)
        accelerated = accelerate(fn, budget=math.inf)
        ours = threaded(accelerated, params)
        settle(ours)
        plain()
        row = harness.compare(
            f"JAX {name}: accelerate(fn)",
            baseline=plain,
            ours=ours,
            baseline_name="jax.jit(fn)",
            quick=args.quick,
        )
        ours = accelerated
        row.extra["chosen"] = ours.explain().chosen("call")
        row.extra["lane"] = "yes" if getattr(ours, "_lane", None) is not None else "no"
        row.extra["target"] = "<= 5 µs"
        rows.append(row)
    return rows


def torch_rows() -> list[harness.Row]:
    import torch
    from torch import nn

    from dualtrain.craft import Craft, dock
    from dualtrain_torch import accelerate, realize

    harness.set_torch_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(32, 64)

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward_row(case: str, plain: nn.Module, ours: nn.Module, name: str) -> harness.Row:
        with torch.no_grad():
            settle(ours, x)
            row = harness.compare(
                case,
                baseline=lambda: plain(x),
                ours=lambda: ours(x),
                baseline_name=name,
                quick=args.quick,
            )
        row.extra["target"] = "<= 2 µs"
        return row

    plain, ours = mlp().eval(), mlp().eval()
    accelerate(ours, budget=math.inf)
    row = forward_row("torch forward: accelerate(model)", plain, ours, "the model, eager")
    row.extra["chosen"] = ours.forward.explain().chosen("eval")
    rows = [row]

    class Tiny(Craft):
        def __init__(self) -> None:
            super().__init__("TINY")
            self.fc1 = dock.Dense(64, 64)
            self.fc2 = dock.Dense(64, 4)

        def run(self, x):
            return self.fc2(dock.relu(self.fc1(x)))

    craft = realize(Tiny(), seed=0).eval()
    rows.append(forward_row("torch forward: a realized Craft", plain, craft, "nn.Sequential"))
    return rows


def main() -> None:
    rows = jax_rows() + torch_rows()
    for row in rows:
        row.extra["over"] = f"{(row.ours.median - row.base.median) * 1e6:+.2f} µs"
    harness.report("call_overhead", rows, args, settle_calls=SETTLE)


if __name__ == "__main__":
    main()
