"""The verified compile ladder: eager against the rung it chose, training and evaluation.

Models (float32, the issue's three):

- ``nebulgym``: nebulgym's README model, 3x224x224 -> AvgPool(4) -> mean over channels ->
  3136-1024-2048-1024-512-256-2 with BatchNorm1d and ReLU, batch 8;
- ``mlp``: 784-256-256-10 (ReLU), batch 64;
- ``cnn``: 3x32x32 -> conv 32@3x3 (no bias) -> BatchNorm -> ReLU -> max-pool -> conv 64@3x3
  -> BatchNorm -> ReLU -> max-pool -> dropout 0.2 -> 4096-10, batch 64.

torch: a train step is zero_grad, forward, cross-entropy, backward, SGD (lr 0.01, momentum
0.9). ``eager`` runs it as written; ``ladder`` runs ``TrainingLearner(model, backends,
optimizer=...).step`` (the forward's ladder: CHANNELS_LAST, TORCH_COMPILE, ONNXRUNTIME,
CUDA_GRAPHS (CUDA only), PYTORCH; the step's: COMPILED_STEP, PYTORCH). An eval step is the
forward under ``torch.no_grad()`` in eval mode, eager against ``accelerate(model)``. JAX: the
same step as one function (``jax.value_and_grad`` + optax SGD), ``op-by-op`` (under
``jax.disable_jit``) and plain ``jax.jit`` written by hand against
``dualtrain_jax.accelerate(step)``; eval the same with the forward alone.

Every ladder here climbs at the first call (``budget=math.inf``): this benchmark measures
what the chosen rung runs at. Reported beside the times: the rung chosen, the seconds the
first call spent deciding (compiling every candidate, verifying, timing), and a second
run's decision: a fresh model
accelerated with the same decision cache, the seconds its first call spent deciding (the
cache read; a chosen compiler still compiles in that call, reported as ``2nd first call``).

    ./dev bench accelerate [--threads 1] [--quick] [--models nebulgym mlp cnn]
                           [--frameworks torch jax] [--device cuda]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness

MODELS = ("nebulgym", "mlp", "cnn")
FRAMEWORKS = ("torch", "jax")
BATCH = {"nebulgym": 8, "mlp": 64, "cnn": 64}
SHAPE = {"nebulgym": (3, 224, 224), "mlp": (784,), "cnn": (3, 32, 32)}
CLASSES = {"nebulgym": 2, "mlp": 10, "cnn": 10}


def _options(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument(
        "--device", default="cpu", help="torch's device (cuda on a GPU; JAX: JAX_PLATFORMS)"
    )
    own, rest = parser.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        parser.print_help()
    return own, rest


OWN, REST = _options()
args = harness.parse_args("accelerate", REST)  # pins threads before torch and JAX

import numpy as np  # noqa: E402

rows: list[harness.Row] = []
CACHE = Path(tempfile.mkdtemp(prefix="bench-accelerate-"))
# What the chosen rung runs at, steady: the whole ladder climbs at the first call, as a user
# who knows the job is long says with budget= (by default a rung waits for its payback,
# which bench_jobs' ladder job measures on a short job).
LONG = {"cache": CACHE, "budget": math.inf}


def _first_call(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _decided(explanation: Any, mode: str) -> tuple[str, float, bool]:
    for d in explanation.decisions:
        if d.mode == mode:
            return d.chosen, d.decide_s, d.from_cache
    return "?", float("nan"), False


# -- torch --------------------------------------------------------------------------------


def torch_cases() -> None:
    import torch
    from torch import nn

    harness.set_torch_threads(args.threads)
    from dualtrain_torch import TrainingLearner, accelerate

    device = torch.device(OWN.device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def build(kind: str) -> nn.Module:
        return _build(kind).to(device)

    def _build(kind: str) -> nn.Module:
        torch.manual_seed(0)
        if kind == "mlp":
            return nn.Sequential(
                nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
            )
        if kind == "cnn":
            return nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1, bias=False),
                nn.BatchNorm2d(32),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 3, padding=1, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Dropout(0.2),
                nn.Linear(64 * 8 * 8, 10),
            )
        return NebulgymModel()

    class NebulgymModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._avg_pool = nn.AvgPool2d(4)
            self._linear = nn.Linear(3136, 1024)
            self._relu = nn.ReLU()
            self._linears = nn.Sequential(
                nn.BatchNorm1d(1024), nn.Linear(1024, 2048), nn.ReLU(),
                nn.BatchNorm1d(2048), nn.Linear(2048, 1024), nn.ReLU(),
                nn.BatchNorm1d(1024), nn.Linear(1024, 512), nn.ReLU(),
                nn.BatchNorm1d(512), nn.Linear(512, 256), nn.ReLU(),
                nn.Linear(256, 2),
            )  # fmt: skip

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self._avg_pool(x).mean(dim=-3).view(-1, 3136)
            x = self._relu(self._linear(x))
            return self._linears(x)

    def sgd(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def one(kind: str) -> None:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn((BATCH[kind], *SHAPE[kind]), generator=gen).to(device)
        y = torch.randint(0, CLASSES[kind], (BATCH[kind],), generator=gen).to(device)
        eager = build(kind)
        opt = sgd(eager)

        def eager_step(model: nn.Module = eager, opt: Any = opt) -> None:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            sync()

        def ladder_step(learner: Any) -> None:
            learner.step(x, y)
            sync()

        def ladder_learner() -> Any:
            model = build(kind)
            return TrainingLearner(model, None, optimizer=sgd(model), **LONG)

        learner = ladder_learner()
        decide = _first_call(lambda learner=learner: learner.step(x, y))
        again = ladder_learner()
        second = _first_call(lambda again=again: again.step(x, y))
        report = learner.explain()
        forward_rung, _, _ = _decided(report, "train")
        step_rung, _, _ = _decided(report, "step")
        _, cached_s, from_cache = _decided(again.explain(), "step")
        rows.append(
            harness.compare(
                f"torch {kind} train",
                baseline=eager_step,
                ours=lambda learner=learner: ladder_step(learner),
                baseline_name="eager step",
                quick=args.quick,
                chosen=f"forward {forward_rung}, step {step_rung}",
                decide_s=round(decide, 1),
                cached_decide_s=f"{cached_s:.3f}" + ("" if from_cache else " (not cached)"),
                second_first_call_s=round(second, 1),
            )
        )
        print(report, flush=True)

        eager.eval()

        def eager_eval(model: nn.Module = eager) -> None:
            with torch.no_grad():
                model(x)
            sync()

        def ladder_model() -> nn.Module:
            return accelerate(build(kind).eval(), None, **LONG)

        fast = ladder_model()
        decide = _first_call(lambda fast=fast: eager_eval(fast))
        again_model = ladder_model()
        second = _first_call(lambda m=again_model: eager_eval(m))
        rung, _, _ = _decided(fast.forward.explain(), "eval")
        _, cached_s, from_cache = _decided(again_model.forward.explain(), "eval")
        rows.append(
            harness.compare(
                f"torch {kind} eval",
                baseline=eager_eval,
                ours=lambda fast=fast: eager_eval(fast),
                baseline_name="eager no_grad",
                quick=args.quick,
                chosen=rung,
                decide_s=round(decide, 1),
                cached_decide_s=f"{cached_s:.3f}" + ("" if from_cache else " (not cached)"),
                second_first_call_s=round(second, 1),
            )
        )
        print(fast.forward.explain(), flush=True)

    for kind in OWN.models:
        one(kind)


# -- JAX ----------------------------------------------------------------------------------


def jax_cases() -> None:
    import jax
    import jax.numpy as jnp
    import optax

    from dualtrain_jax import accelerate

    def init(kind: str) -> tuple[Any, Callable[[Any, Any], Any]]:
        key = jax.random.PRNGKey(0)
        if kind == "mlp":
            sizes = [784, 256, 256, 10]
            params = []
            for i, (a, b) in enumerate(itertools.pairwise(sizes)):
                k = jax.random.fold_in(key, i)
                params.append((jax.random.normal(k, (a, b)) * (2 / a) ** 0.5, jnp.zeros(b)))

            def apply(p: Any, x: Any) -> Any:
                for w, b in p[:-1]:
                    x = jax.nn.relu(x @ w + b)
                w, b = p[-1]
                return x @ w + b

            return params, apply
        if kind == "cnn":
            k1, k2, k3 = jax.random.split(key, 3)
            params = {
                "c1": jax.random.normal(k1, (32, 3, 3, 3)) * 0.2,
                "c2": jax.random.normal(k2, (64, 32, 3, 3)) * 0.06,
                "w": jax.random.normal(k3, (64 * 8 * 8, 10)) * 0.02,
                "b": jnp.zeros(10),
            }

            def conv(x: Any, w: Any) -> Any:
                y = jax.lax.conv_general_dilated(
                    x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")
                )
                y = (y - y.mean((0, 2, 3), keepdims=True)) / jnp.sqrt(
                    y.var((0, 2, 3), keepdims=True) + 1e-5
                )
                y = jax.nn.relu(y)
                return jax.lax.reduce_window(
                    y, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"
                )

            def apply(p: Any, x: Any) -> Any:
                y = conv(conv(x, p["c1"]), p["c2"])
                return y.reshape(y.shape[0], -1) @ p["w"] + p["b"]

            return params, apply
        k = iter(jax.random.split(key, 8))
        dims = [1024, 2048, 1024, 512, 256]
        params = {"l0": (jax.random.normal(next(k), (3136, 1024)) * 0.02, jnp.zeros(1024))}
        for i, (a, b) in enumerate(itertools.pairwise(dims)):
            params[f"l{i + 1}"] = (
                jax.random.normal(next(k), (a, b)) * (2 / a) ** 0.5,
                jnp.zeros(b),
            )
        params["head"] = (jax.random.normal(next(k), (256, 2)) * 0.06, jnp.zeros(2))

        def apply(p: Any, x: Any) -> Any:
            n = x.shape[0]
            x = x.reshape(n, 3, 56, 4, 56, 4).mean((3, 5)).mean(1).reshape(n, 3136)
            x = jax.nn.relu(x @ p["l0"][0] + p["l0"][1])
            for i in range(1, 5):
                x = (x - x.mean(0)) / jnp.sqrt(x.var(0) + 1e-5)
                x = jax.nn.relu(x @ p[f"l{i}"][0] + p[f"l{i}"][1])
            return x @ p["head"][0] + p["head"][1]

        return params, apply

    def one(kind: str) -> None:
        params, apply = init(kind)
        tx = optax.sgd(0.01, momentum=0.9)
        gen = np.random.default_rng(0)
        x = jnp.asarray(gen.standard_normal((BATCH[kind], *SHAPE[kind]), dtype=np.float32))
        y = jnp.asarray(gen.integers(0, CLASSES[kind], BATCH[kind]))

        def step(params: Any, opt_state: Any, x: Any, y: Any, apply: Any = apply) -> Any:
            def loss_fn(p: Any) -> Any:
                logits = apply(p, x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        state = {"p": params, "o": tx.init(params)}

        def run(fn: Callable[..., Any], state: dict[str, Any] = state) -> None:
            p, o, loss = fn(state["p"], state["o"], x, y)
            state["p"], state["o"] = p, o
            loss.block_until_ready()

        def op_by_op() -> None:
            with jax.disable_jit():
                run(step)

        plain = jax.jit(step, donate_argnums=(0, 1))
        fast = accelerate(step, **LONG)
        decide = _first_call(lambda: run(fast))
        again = accelerate(step, **LONG)
        fresh = {"p": jax.tree.map(jnp.copy, state["p"]), "o": jax.tree.map(jnp.copy, state["o"])}
        second = _first_call(lambda: run(again, fresh))
        rung, _, _ = _decided(fast.explain(), "call")
        _, cached_s, from_cache = _decided(again.explain(), "call")
        extra = {
            "chosen": rung,
            "decide_s": round(decide, 1),
            "cached_decide_s": f"{cached_s:.3f}" + ("" if from_cache else " (not cached)"),
            "second_first_call_s": round(second, 1),
        }
        rows.append(
            harness.compare(
                f"jax {kind} train",
                baseline=op_by_op,
                ours=lambda: run(fast),
                baseline_name="op-by-op",
                quick=args.quick,
                warmup=1,
                **extra,
            )
        )
        rows.append(
            harness.compare(
                f"jax {kind} train",
                baseline=lambda: run(plain),
                ours=lambda: run(fast),
                baseline_name="jax.jit by hand",
                quick=args.quick,
                chosen=rung,
            )
        )
        print(fast.explain(), flush=True)

        def forward(params: Any, x: Any, apply: Any = apply) -> Any:
            return apply(params, x)

        def eval_op_by_op() -> None:
            with jax.disable_jit():
                forward(state["p"], x).block_until_ready()

        fast_eval = accelerate(forward, **LONG)
        decide = _first_call(lambda: fast_eval(state["p"], x).block_until_ready())
        rung, _, _ = _decided(fast_eval.explain(), "call")
        rows.append(
            harness.compare(
                f"jax {kind} eval",
                baseline=eval_op_by_op,
                ours=lambda: fast_eval(state["p"], x).block_until_ready(),
                baseline_name="op-by-op",
                quick=args.quick,
                warmup=1,
                chosen=rung,
                decide_s=round(decide, 1),
            )
        )

    for kind in OWN.models:
        one(kind)


if "torch" in OWN.frameworks:
    torch_cases()
if "jax" in OWN.frameworks:
    jax_cases()
harness.report("accelerate", rows, args, cache=str(CACHE), device=OWN.device)
