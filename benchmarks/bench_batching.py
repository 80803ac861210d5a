"""Model batching: N same-architecture models, one SGD train step, six ways in one run.

Models: an MLP 784-256-256-10 and a LeNet-5-like CNN (1x28x28 -> conv 6@5x5 pad 2 -> max-pool
-> conv 16@5x5 -> max-pool -> 400-120-84-10, ReLU), N = 8, 32, 128 members, image batch 64 per
member (each member its own data), softmax cross-entropy, plain SGD (lr 0.01). One step is
forward, loss, backward and the optimizer's update of every member. The ways:

torch (eager):
- ``loop``: N ``nn.Sequential`` models, one ``torch.optim.SGD`` each, stepped in turn.
- ``dualtrain``: ``dualtrain_torch.BatchModule`` (strategy "auto", tuned before timing),
  ``batch_loss(...).sum().backward()``, one SGD over ``bm.parameters()``.
- ``raw vmap``: ``torch.func.stack_module_state`` + ``functional_call`` +
  ``vmap(grad(loss))``, the update by hand (``torch._foreach_add_``).

JAX (each step one jitted function, optax SGD):
- ``loop``: one jitted single-model step called N times.
- ``dualtrain``: ``dualtrain_jax.BatchModule`` of a ``(init_fn, apply_fn)`` pair, ``tune``d
  outside jit, its ``apply`` + ``batch_loss`` inside the jitted step.
- ``raw vmap``: ``jax.vmap(jax.grad(loss))`` inside one jitted step by hand.

Reported per way: model-steps/s (N / step time), the ratio to its framework's loop, and
dualtrain's ratio to the best of its framework's loop and raw vmap (target >= 0.95); GFLOP/s
against the CPU roof (a 2048x2048 float32 ``torch.mm``, measured in the same run and thread
count); build time (models, optimizers, BatchModule construction + tune, for JAX without the
first step's compilation; taken after one single-model step has warmed the framework) and the
first step (compilation included); memory.

Memory: ``state MB`` is computed, not measured: parameters + gradients of all N members in
float32 (SGD keeps no other state). ``peak RSS MB`` (full runs; ``--rss yes`` in quick ones)
is measured in a fresh subprocess per way that imports only its framework, makes the data and
runs one single-model step (so the framework's one-time set-up is not charged), resets the
peak RSS (``/proc/self/clear_refs``), then builds the way (dualtrain with the strategy auto
chose in the main run, forced: no tuning) and runs two steps: the peak RSS (``VmHWM``) minus
the RSS just before the build. Allocator caches, XLA compilation and each step's activations
count; the data does not.

FLOPs are counted analytically: the forward's multiply-adds x 2, plus as much again for the
weight gradients and for the input gradients of every layer but the first (the images need
no gradient); pooling, activations, the loss and the update are not counted.

Timing: after the build and the first step, every way of one case (both frameworks) runs
round-robin, sample by sample, so machine noise hits all alike; median and p10-p90 of the
samples. Slow cases (a step over 0.5 s) take 3 samples of one step.

The optimizer step (torch): ``dualtrain_torch.member_optimizer`` Adam, one learning rate per
member (a log-spaced sweep), against ``torch.optim.Adam`` (one learning rate) with
``fused=True`` and with ``foreach=True``, each over its own copy of the same stacked
parameters ``[16, ...]`` of an MLP 3072-64-4 (3.15M parameters) and of an MLP 64-64-4 (71k:
per-call costs dominate), with fixed random gradients; ``step()`` alone is timed
(`harness.compare`, alternating samples). ``--optimizer-step only`` runs just this case
(results by default in ``results/batching-optimizer-step.json``, not the full run's file).

    ./dev bench batching [--threads 1] [--quick] [--models mlp cnn] [--frameworks torch jax]
                         [--members 8 32 128]
                         [--image-batch 64] [--rss auto|yes|no]
                         [--optimizer-step yes|no|only] [--list]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness

LR = 0.01
MODELS = ("mlp", "cnn")
WAYS = ("loop", "dualtrain", "raw vmap")
FRAMEWORKS = ("torch", "jax")
ROOF_N = 2048


def _options(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """This benchmark's own options; the rest goes to `harness.parse_args`."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument("--members", nargs="+", type=int, default=None)
    parser.add_argument("--image-batch", type=int, default=64)
    parser.add_argument("--rss", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument(
        "--optimizer-step",
        choices=("yes", "no", "only"),
        default="yes",
        help="the member_optimizer Adam step against torch.optim.Adam (only: nothing else)",
    )
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # the RSS subprocess
    own, rest = parser.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        parser.print_help()
    if own.image_batch <= 0 or any(n <= 0 for n in own.members or ()):
        parser.error("--image-batch and --members must be positive ints")
    if own.optimizer_step == "only" and "torch" not in own.frameworks:
        parser.error("--optimizer-step only times torch's optimizers: keep torch in --frameworks")
    return own, rest


OWN, REST = _options()
args = harness.parse_args("batching", REST)  # pins threads before torch and JAX are imported
MEMBERS = OWN.members or ([8] if args.quick else [8, 32, 128])
RSS = OWN.rss == "yes" or (OWN.rss == "auto" and not args.quick)

OPTIMIZER_STEP = OWN.optimizer_step != "no" and "torch" in OWN.frameworks
OPT_MEMBERS = 16
OPT_MLPS = {"3072-64-4": (3072, 64, 4), "64-64-4": (64, 64, 4)}  # in, hidden, out

if OWN.list:
    for model in OWN.models if OWN.optimizer_step != "only" else ():
        for n in MEMBERS:
            print(
                f"{model} N={n} image batch {OWN.image_batch}: {', '.join(WAYS)} "
                f"x {', '.join(OWN.frameworks)}"
            )
    for label in OPT_MLPS if OPTIMIZER_STEP else ():
        print(
            f"Adam step MLP {label} N={OPT_MEMBERS}: member_optimizer x torch.optim.Adam "
            "fused, foreach"
        )
    print(f"peak RSS per way in a subprocess: {'yes' if RSS else 'no'}")
    sys.exit(0)

_CHILD = json.loads(OWN.child) if OWN.child else None
_NEED = (_CHILD["framework"],) if _CHILD else FRAMEWORKS

import numpy as np  # noqa: E402

if "torch" in _NEED:
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn
    from torch.func import functional_call, grad, stack_module_state, vmap

    from dualtrain_torch import (
        BatchModule as TorchBatch,
        batch_loss as torch_batch_loss,
        member_optimizer,
    )

    harness.set_torch_threads(args.threads)
if "jax" in _NEED:
    import jax
    import jax.numpy as jnp
    import optax
    from jax import lax

    from dualtrain_jax import BatchModule as JaxBatch, batch_loss as jax_batch_loss


# -- the models and their FLOPs --------------------------------------------------------

SHAPES = {"mlp": (784,), "cnn": (1, 28, 28)}


def flops_per_step(model: str, batch: int) -> int:
    """FLOPs of one member's forward and backward (see the module's docstring)."""
    if model == "mlp":
        layers = [784 * 256, 256 * 256, 256 * 10]  # multiply-adds per sample
    else:
        layers = [6 * 28 * 28 * 25, 16 * 10 * 10 * 6 * 25, 400 * 120, 120 * 84, 84 * 10]
    macs = sum(layers)
    return 2 * batch * (3 * macs - layers[0])


def torch_model(model: str) -> Any:
    if model == "mlp":
        return nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        )
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    )  # fmt: skip


def jax_model(model: str) -> tuple[Callable[[Any], dict[str, Any]], Callable[..., Any]]:
    """``(init_fn, apply_fn)`` of the same network in plain JAX (torch's layouts and init)."""
    if model == "mlp":
        dense = [("fc1", 784, 256), ("fc2", 256, 256), ("fc3", 256, 10)]
        convs: list[tuple[str, int, int, int]] = []
    else:
        dense = [("fc1", 400, 120), ("fc2", 120, 84), ("fc3", 84, 10)]
        convs = [("conv1", 1, 6, 2), ("conv2", 6, 16, 0)]

    def init_fn(key: Any) -> dict[str, Any]:
        params = {}
        keys = iter(jax.random.split(key, 2 * (len(dense) + len(convs))))
        for name, cin, cout, _ in convs:
            bound = 1 / np.sqrt(cin * 25)
            params[f"{name}.weight"] = jax.random.uniform(
                next(keys), (cout, cin, 5, 5), minval=-bound, maxval=bound
            )
            params[f"{name}.bias"] = jax.random.uniform(
                next(keys), (cout,), minval=-bound, maxval=bound
            )
        for name, cin, cout in dense:
            bound = 1 / np.sqrt(cin)
            params[f"{name}.weight"] = jax.random.uniform(
                next(keys), (cout, cin), minval=-bound, maxval=bound
            )
            params[f"{name}.bias"] = jax.random.uniform(
                next(keys), (cout,), minval=-bound, maxval=bound
            )
        return params

    def pool(h: Any) -> Any:
        return lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def apply_fn(p: dict[str, Any], x: Any) -> Any:
        h = x
        for name, *_, pad in convs:
            h = lax.conv_general_dilated(
                h, p[f"{name}.weight"], (1, 1), ((pad, pad), (pad, pad)),
                dimension_numbers=("NCHW", "OIHW", "NCHW"),
            )  # fmt: skip
            h = pool(jax.nn.relu(h + p[f"{name}.bias"].reshape(1, -1, 1, 1)))
        h = h.reshape(h.shape[0], -1)
        for i, (name, *_) in enumerate(dense):
            h = h @ p[f"{name}.weight"].T + p[f"{name}.bias"]
            if i < len(dense) - 1:
                h = jax.nn.relu(h)
        return h

    return init_fn, apply_fn


# -- the ways: each build returns (step, info) -----------------------------------------

Step = Callable[[], None]


def chosen(explain: str) -> str:
    """The strategy in ``explain()``: its second line is ``strategy: NAME[, chunks of K] (why)``."""
    line = explain.splitlines()[1].split(":", 1)[1].strip()
    return line.rsplit(" (", 1)[0].split(",")[0]


def torch_data(model: str, n: int, b: int) -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, b, *SHAPES[model], generator=gen), torch.randint(
        0, 10, (n, b), generator=gen
    )


def torch_loop(
    model: str, n: int, x: Any, y: Any, strategy: str | None
) -> tuple[Step, dict[str, Any]]:
    torch.manual_seed(0)
    models = [torch_model(model) for _ in range(n)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    xs, ys = list(x.unbind(0)), list(y.unbind(0))  # each model its own data

    def step() -> None:
        for m, opt, xi, yi in zip(models, optimizers, xs, ys, strict=True):
            opt.zero_grad()
            F.cross_entropy(m(xi), yi).backward()
            opt.step()

    return step, {}


def torch_dualtrain(
    model: str, n: int, x: Any, y: Any, strategy: str | None
) -> tuple[Step, dict[str, Any]]:
    torch.manual_seed(0)
    bm = TorchBatch(torch_model(model), n, seed=0, strategy=strategy or "auto")
    if strategy is None:
        bm.tune(x)  # measures the candidates (forward and backward) and probes isolation
    optimizer = torch.optim.SGD(bm.parameters(), lr=LR)

    def step() -> None:
        optimizer.zero_grad()
        torch_batch_loss(bm(x), y, n).sum().backward()
        optimizer.step()

    return step, {"strategy": chosen(bm.explain()), "explain": bm.explain()}


def torch_raw_vmap(
    model: str, n: int, x: Any, y: Any, strategy: str | None
) -> tuple[Step, dict[str, Any]]:
    torch.manual_seed(0)
    models = [torch_model(model) for _ in range(n)]
    params, buffers = stack_module_state(models)
    base = torch_model(model).to("meta")
    plist = list(params.values())

    def loss(p: dict[str, Any], b: dict[str, Any], xi: Any, yi: Any) -> Any:
        return F.cross_entropy(functional_call(base, (p, b), (xi,)), yi)

    grads_of = vmap(grad(loss), in_dims=(0, 0, 0, 0))

    def step() -> None:
        grads = grads_of(params, buffers, x, y)
        with torch.no_grad():
            torch._foreach_add_(plist, [grads[k] for k in params], alpha=-LR)

    return step, {}


def jax_data(model: str, n: int, b: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, b, *SHAPES[model]), dtype=np.float32)
    return jnp.asarray(x), jnp.asarray(rng.integers(0, 10, (n, b)), dtype=jnp.int32)


def _member_keys(n: int) -> Any:
    return jax.vmap(jax.random.PRNGKey)(jnp.arange(n))


def jax_loop(
    model: str, n: int, x: Any, y: Any, strategy: str | None
) -> tuple[Step, dict[str, Any]]:
    init_fn, apply_fn = jax_model(model)
    tx = optax.sgd(LR)
    init = jax.jit(init_fn)
    params = [init(k) for k in _member_keys(n)]
    state = {"p": params, "s": [tx.init(p) for p in params]}
    xs, ys = list(x), list(y)  # each model its own data

    @jax.jit
    def update(p: Any, s: Any, xi: Any, yi: Any) -> tuple[Any, Any]:
        g = jax.grad(
            lambda p: optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, xi), yi).mean()
        )(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    def step() -> None:
        out = [
            update(p, s, xi, yi)
            for p, s, xi, yi in zip(state["p"], state["s"], xs, ys, strict=True)
        ]
        state["p"], state["s"] = [o[0] for o in out], [o[1] for o in out]
        jax.block_until_ready(state["p"])

    return step, {}


def jax_dualtrain(
    model: str, n: int, x: Any, y: Any, strategy: str | None
) -> tuple[Step, dict[str, Any]]:
    bm = JaxBatch(jax_model(model), n, seed=0, strategy=strategy or "auto")
    if strategy is None:
        bm.tune(x)  # outside jit: the traced step below uses what this measured
    tx = optax.sgd(LR)
    train = bool(bm.train)

    @jax.jit
    def update(params: Any, s: Any, opt_state: Any, x: Any, y: Any) -> tuple[Any, Any]:
        def loss(p: Any) -> Any:
            out, _ = bm.apply(p, s, x, train=train)
            return jax_batch_loss(out, y, n).sum()

        g = jax.grad(loss)(params)
        u, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, u), opt_state

    state = {"o": tx.init(bm.params)}

    def step() -> None:
        bm.params, state["o"] = update(bm.params, bm.state, state["o"], x, y)
        jax.block_until_ready(bm.params)

    return step, {"strategy": chosen(bm.explain()), "explain": bm.explain()}


def jax_raw_vmap(
    model: str, n: int, x: Any, y: Any, strategy: str | None
) -> tuple[Step, dict[str, Any]]:
    init_fn, apply_fn = jax_model(model)
    tx = optax.sgd(LR)
    params = jax.vmap(init_fn)(_member_keys(n))

    def loss(p: Any, xi: Any, yi: Any) -> Any:
        return optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, xi), yi).mean()

    @jax.jit
    def update(p: Any, s: Any, x: Any, y: Any) -> tuple[Any, Any]:
        g = jax.vmap(jax.grad(loss))(p, x, y)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    state = {"p": params, "s": tx.init(params)}

    def step() -> None:
        state["p"], state["s"] = update(state["p"], state["s"], x, y)
        jax.block_until_ready(state["p"])

    return step, {}


BUILDERS = {
    ("torch", "loop"): torch_loop,
    ("torch", "dualtrain"): torch_dualtrain,
    ("torch", "raw vmap"): torch_raw_vmap,
    ("jax", "loop"): jax_loop,
    ("jax", "dualtrain"): jax_dualtrain,
    ("jax", "raw vmap"): jax_raw_vmap,
}


def data_for(framework: str, model: str, n: int) -> tuple[Any, Any]:
    make = torch_data if framework == "torch" else jax_data
    return make(model, n, OWN.image_batch)


# -- measuring -------------------------------------------------------------------------


def roof() -> float:
    """FLOP/s of a large float32 matmul on this thread count: the CPU roof."""
    a, b = torch.randn(ROOF_N, ROOF_N), torch.randn(ROOF_N, ROOF_N)
    torch.mm(a, b)
    times = []
    for _ in range(3 if args.quick else 5):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * ROOF_N**3 / min(times)


def time_round_robin(steps: dict[str, Step]) -> dict[str, harness.Timing]:
    """Every way sample by sample in turn; each sample lasts about `sample_s`."""
    once = {}
    for name, step in steps.items():
        start = time.perf_counter()
        step()
        once[name] = time.perf_counter() - start
    sample_s, samples = (0.05, 3) if args.quick else (0.2, 7)
    if max(once.values()) > 0.5:
        samples = 3  # a slow case: three one-step samples are enough for a median
    calls = {k: max(1, int(sample_s / max(v, 1e-6))) for k, v in once.items()}
    got: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(samples):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(calls[name]):
                step()
            got[name].append((time.perf_counter() - start) / calls[name])
    return {k: harness._summary(v) for k, v in got.items()}


def child_rss(framework: str, model: str, n: int, way: str, strategy: str | None) -> dict[str, Any]:
    """Peak RSS growth of building `way` and running two steps, in a fresh process."""
    spec = {"framework": framework, "model": model, "n": n, "way": way, "strategy": strategy}
    cmd = [
        sys.executable, __file__, "--threads", str(args.threads),
        "--image-batch", str(OWN.image_batch), "--child", json.dumps(spec),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise OSError(f"no {field} in /proc/self/status")


def run_child(spec: dict[str, Any]) -> None:
    x, y = data_for(spec["framework"], spec["model"], spec["n"])
    # One single-model step first: the framework's one-time set-up (thread pools, BLAS
    # buffers, the autograd engine, XLA's runtime) is not charged to the way measured.
    warm, _ = BUILDERS[spec["framework"], "loop"](spec["model"], 1, x[:1], y[:1], None)
    warm()
    warm()
    del warm
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak RSS to the RSS now: imports' peak no longer counts
        reset = True
    except OSError:
        reset = False  # then ru_maxrss may still hold the imports' peak: an upper bound
    before = _status_mb("VmRSS")
    step, _ = BUILDERS[spec["framework"], spec["way"]](
        spec["model"], spec["n"], x, y, spec["strategy"]
    )
    step()
    step()
    if reset:
        peak = _status_mb("VmHWM")
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        json.dumps({"rss_mb": peak - before, "peak_mb": peak, "before_mb": before, "reset": reset})
    )


def state_mb(framework: str, model: str, n: int) -> float:
    """Parameters + gradients of all members, float32."""
    if framework == "torch":
        count = sum(p.numel() for p in torch_model(model).parameters())
    else:
        count = sum(
            int(np.prod(a.shape))
            for a in jax.tree_util.tree_leaves(jax_model(model)[0](jax.random.PRNGKey(0)))
        )
    return 2 * 4 * count * n / 2**20


def run_case(model: str, n: int, cpu_roof: float) -> list[dict[str, Any]]:
    ways: list[dict[str, Any]] = []
    steps: dict[str, Step] = {}
    for framework in OWN.frameworks:
        x, y = data_for(framework, model, n)
        warm, _ = BUILDERS[framework, "loop"](model, 1, x[:1], y[:1], None)
        warm()  # the framework's one-time set-up is no way's build time
        del warm
        for way in WAYS:
            start = time.perf_counter()
            step, info = BUILDERS[framework, way](model, n, x, y, None)
            built = time.perf_counter() - start
            start = time.perf_counter()
            step()
            first = time.perf_counter() - start
            name = f"{framework} {way}"
            steps[name] = step
            ways.append({
                "model": model, "members": n, "framework": framework, "way": way,
                "strategy": info.get("strategy"), "explain": info.get("explain"),
                "build_s": built, "first_step_s": first, "state_mb": state_mb(framework, model, n),
            })  # fmt: skip
            print(
                f"  {model} N={n} {name}: built in {built:.2f} s, first step {first:.2f} s",
                flush=True,
            )
    timings = time_round_robin(steps)
    flops = flops_per_step(model, OWN.image_batch) * n
    for w in ways:
        t = timings[f"{w['framework']} {w['way']}"]
        w["timing"] = t
        w["step_s"] = t.as_dict()
        w["model_steps_per_s"] = n / t.median
        w["gflops"] = flops / t.median / 1e9
        w["roof_fraction"] = flops / t.median / cpu_roof
    for w in ways:
        same = {v["way"]: v["timing"].median for v in ways if v["framework"] == w["framework"]}
        w["ratio_to_loop"] = same["loop"] / w["timing"].median
        w["ratio_to_best_baseline"] = min(same["loop"], same["raw vmap"]) / w["timing"].median
    if RSS:
        for w in ways:
            w.update(child_rss(w["framework"], model, n, w["way"], w["strategy"]))
    del steps
    return ways


# -- the optimizer step ----------------------------------------------------------------


def optimizer_rows() -> list[harness.Row]:
    """member_optimizer Adam against torch.optim.Adam fused and foreach (module docstring)."""
    rows = []
    n = OPT_MEMBERS
    lrs = np.logspace(-4, -1, n).tolist()
    for label, (fan_in, hidden, out) in OPT_MLPS.items():
        shapes = [(n, hidden, fan_in), (n, hidden), (n, out, hidden), (n, out)]

        def stacked(shapes: list[tuple[int, ...]] = shapes) -> list[Any]:
            gen = torch.Generator().manual_seed(0)  # the same values for every optimizer
            params = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen) * 0.01
            return params

        ours = member_optimizer(stacked(), "adam", n, lr=lrs)
        count = sum(int(np.prod(s)) for s in shapes)
        for kind in ("fused", "foreach"):
            theirs = torch.optim.Adam(
                stacked(), lr=1e-3, fused=kind == "fused", foreach=kind == "foreach"
            )
            rows.append(
                harness.compare(
                    f"Adam step MLP {label} N={n}",
                    baseline=theirs.step,
                    ours=ours.step,
                    baseline_name=f"torch Adam {kind}",
                    quick=args.quick,
                    params=f"{count / 1e6:.2f}M",
                )
            )
            print(f"  {rows[-1].case} vs {rows[-1].baseline}: {rows[-1].ratio:.2f}x", flush=True)
    return rows


# -- reporting -------------------------------------------------------------------------


def _by(ways: list[dict[str, Any]], framework: str, way: str) -> dict[str, Any]:
    return next(w for w in ways if w["framework"] == framework and w["way"] == way)


def rows_of(ways: list[dict[str, Any]]) -> list[harness.Row]:
    """One row per (model, N, framework): dualtrain against the loop, raw vmap beside it."""
    rows = []
    for model in OWN.models:
        for n in MEMBERS:
            case = [w for w in ways if w["model"] == model and w["members"] == n]
            for framework in OWN.frameworks:
                loop = _by(case, framework, "loop")
                raw = _by(case, framework, "raw vmap")
                ours = _by(case, framework, "dualtrain")
                best = min(loop["timing"].median, raw["timing"].median)
                vs_best = best / ours["timing"].median
                rows.append(harness.Row(
                    f"{model.upper()} N={n} {'torch' if framework == 'torch' else 'JAX'}",
                    f"{framework} loop", loop["timing"], ours["timing"],
                    {
                        "strategy": ours["strategy"],
                        "raw vmap x loop": f"{loop['timing'].median / raw['timing'].median:.2f}x",
                        "x best(loop, raw)": f"{vs_best:.2f}x{'' if vs_best >= 0.95 else ' MISS'}",
                        "steps/s": f"{ours['model_steps_per_s']:.0f}",
                        "% roof": f"{100 * ours['roof_fraction']:.0f}%",
                    },
                ))  # fmt: skip
    return rows


def print_ways(ways: list[dict[str, Any]], cpu_roof: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"every way: {args.threads} thread(s), roof {cpu_roof / 1e9:.1f} GFLOP/s "
        f"({ROOF_N}x{ROOF_N} float32 torch.mm), image batch {OWN.image_batch}"
    )
    columns = ("model", "N", "way", "step [p10-p90]", "model-steps/s", "x loop", "GFLOP/s",
               "% roof", "build s", "1st step s", "state MB", "peak RSS MB")  # fmt: skip
    for c in columns:
        table.add_column(c, justify="left" if c in ("model", "way") else "right")
    for w in ways:
        loop = next(
            v for v in ways
            if (v["model"], v["members"], v["framework"], v["way"])
            == (w["model"], w["members"], w["framework"], "loop")
        )  # fmt: skip
        t = w["timing"]
        way = f"{w['framework']} {w['way']}" + (f" ({w['strategy']})" if w["strategy"] else "")
        rss = f"{w['rss_mb']:.0f}" if "rss_mb" in w else w.get("error", "-")
        table.add_row(
            w["model"].upper(), str(w["members"]), way,
            f"{harness._fmt(t.median)} [{harness._fmt(t.p10)}-{harness._fmt(t.p90)}]",
            f"{w['model_steps_per_s']:.0f}", f"{loop['timing'].median / t.median:.2f}x",
            f"{w['gflops']:.1f}", f"{100 * w['roof_fraction']:.0f}%", f"{w['build_s']:.2f}",
            f"{w['first_step_s']:.2f}", f"{w['state_mb']:.1f}", rss,
        )  # fmt: skip
    Console(width=200).print(table)


def main() -> None:
    if _CHILD is not None:
        run_child(_CHILD)
        return
    started = time.perf_counter()
    if OWN.optimizer_step == "only":
        if args.json == harness.RESULTS / "batching.json":  # never replace the full results
            args.json = harness.RESULTS / "batching-optimizer-step.json"
        harness.report(
            "batching", optimizer_rows(), args, torch=torch.__version__, optimizer_step_only=True
        )
        return
    cpu_roof = roof()
    print(
        f"CPU roof: {cpu_roof / 1e9:.1f} GFLOP/s ({ROOF_N}x{ROOF_N} float32 torch.mm)", flush=True
    )
    ways: list[dict[str, Any]] = []
    for model in OWN.models:
        for n in MEMBERS:
            ways.extend(run_case(model, n, cpu_roof))
    print_ways(ways, cpu_roof)
    for w in ways:
        if w["explain"]:
            print(f"{w['model'].upper()} N={w['members']} {w['framework']}: {w['explain']}")
    harness.report(
        "batching",
        rows_of(ways) + (optimizer_rows() if OPTIMIZER_STEP else []),
        args,
        torch=torch.__version__,
        jax=jax.__version__,
        roof_gflops=cpu_roof / 1e9,
        image_batch=OWN.image_batch,
        memory="state_mb: params+grads computed; rss_mb: peak RSS growth in a subprocess per way",
        ways=[{k: v for k, v in w.items() if k != "timing"} for w in ways],
        wall_s=time.perf_counter() - started,
    )


if __name__ == "__main__":
    main()
