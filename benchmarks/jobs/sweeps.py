"""A learning-rate sweep as one whole job: 16 members, Adam, shared batches, one way.

    python benchmarks/jobs/sweeps.py --framework torch --way ours --model cnn --steps 150

Member i trains with learning rate ``lrs()[i]`` (logspace 1e-4..1e-2) from the same initial
weights as every other member (one seed), on the same batches: a pool of `POOL` batches made
here from a fixed NumPy seed (no downloads), batch s being ``pool[s % POOL]``. Every way
starts from identical weights and sees identical data, so they compute the same 16
trajectories up to float32 rounding order.

Models (inputs ``[B, 64]`` or ``[B, 3, 32, 32]``, 4 classes, softmax cross-entropy):

- ``tiny-mlp``: Linear 64-64, ReLU, Linear 64-4, batch 32;
- ``mlp``: Flatten, Linear 3072-64, ReLU, Linear 64-4, batch 64;
- ``cnn``: Conv 3->16 3x3 stride 2, ReLU, Conv 16->32 3x3 stride 2, ReLU, global average
  pool, Linear 32->4, batch 64. Stride 2 keeps a 1,500-step sweep of 16 members near two
  minutes a way on one core (stride 1 would take ten times as long).

Ways:

- ``plain``: 16 trainings one after the other. torch: an ``nn.Module`` and
  ``torch.optim.Adam(fused=True)`` each (measured here against ``foreach=True`` and the
  per-tensor loop: fused was fastest or tied on all three models). JAX: one ``jax.jit``-ed
  optax Adam step, its learning rate an argument (``optax.inject_hyperparams``), so it
  compiles once for all 16.
- ``ours``: what docs/batching.md teaches: ``BatchModule(net, 16, init="identical",
  shared_input=True)``, ``member_optimizer(..., "adam", 16, lr=LRS)``, ``batch_loss``; under
  JAX the BatchModule of a ``(params, apply_fn)`` pair, ``bm.tune`` outside jit, a jitted
  step.
- ``hand``: the same step-synchronous sweep batched by hand (see `_torch_hand` and
  `_jax_hand` for which version and why).

The last stdout line is JSON: ``{"result": [16 losses on a held-out batch], ...}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `jobs` when run as a script
from jobs.common import Job, script

MEMBERS = 16
POOL = 8  # distinct training batches, cycled
SEED = 0
CLASSES = 4
MODELS = {"tiny-mlp": ((64,), 32), "mlp": ((3, 32, 32), 64), "cnn": ((3, 32, 32), 64)}
WAYS = ("plain", "ours", "hand")
FRAMEWORKS = ("torch", "jax")
BETAS, EPS = (0.9, 0.999), 1e-8
STEPS = (150, 1500)
# Where the torch ways train (`--device`): "cpu", or "cuda" on a lent GPU. The JAX ways run
# where JAX_PLATFORMS puts them (bench_jobs sets it with the same option).
DEVICE = "cpu"

# ---- the jobs ------------------------------------------------------------------------------

# Samples of each way: fewer for the long sweeps (a plain sample of the 1,500-step CNN sweep
# trains 24,000 member-steps, about 2.5 minutes on one core; the MLP and tiny MLP ones
# 0.5-1 minute).
PAIRS = {150: 10, 1500: 5}
PAIRS_CNN_1500 = 3


def _argv(framework: str, way: str, model: str, steps: int) -> list[str]:
    args = ["--framework", framework, "--way", way, "--model", model, "--steps", str(steps)]
    return script("sweeps", *args)


def _job(framework: str, model: str, steps: int) -> Job:
    pairs = PAIRS_CNN_1500 if (model, steps) == ("cnn", 1500) else PAIRS[steps]
    shape, batch = MODELS[model]
    why = " (fewer pairs: long samples)" if pairs < 10 else ""
    return Job(
        name=f"sweep/{model}/{steps}",
        framework=framework,
        ways={way: _argv(framework, way, model, steps) for way in WAYS},
        pairs=pairs,
        quick=steps == 150,
        devices=("cpu", "cuda"),
        tolerance=5e-2,  # float32 orders differ between the ways, for `steps` Adam steps
        note=(
            f"16 lrs, Adam, {steps} steps of {batch} x {'x'.join(map(str, shape))}, shared "
            f"batches; 16 runs in turn vs BatchModule + member_optimizer vs by hand{why}"
        ),
    )


JOBS: list[Job] = [
    _job(framework, model, steps) for steps in STEPS for framework in FRAMEWORKS for model in MODELS
]

# ---- the data ------------------------------------------------------------------------------


def lrs(members: int = MEMBERS) -> np.ndarray:
    """Member i's learning rate: logspace 1e-4..1e-2, float64 ``[members]``."""
    return np.logspace(-4, -2, members)


def make_data(model: str) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
    """``POOL`` training batches and one held-out batch, float32 inputs, int64 labels.

    Each class shifts the inputs along its own fixed direction (for images: one constant per
    channel, which a global-average-pool CNN can see), so every model has something to learn.
    """
    shape, batch = MODELS[model]
    rng = np.random.default_rng(SEED)
    if len(shape) == 1:
        centres = rng.standard_normal((CLASSES, *shape))
    else:
        centres = np.broadcast_to(rng.standard_normal((CLASSES, shape[0], 1, 1)), (CLASSES, *shape))

    def one() -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, CLASSES, batch)
        x = rng.standard_normal((batch, *shape)) + 0.75 * centres[y]
        return x.astype(np.float32), y.astype(np.int64)

    pool = [one() for _ in range(POOL)]
    xe, ye = one()
    return [x for x, _ in pool], [y for _, y in pool], xe, ye


def _strategy(bm: Any) -> str:
    """The strategy line of ``bm.explain()`` (``"strategy: vmap (measured)"``)."""
    lines = [line.strip() for line in bm.explain().splitlines()]
    return next((line for line in lines if line.startswith("strategy")), lines[0])


# ---- torch ---------------------------------------------------------------------------------


def torch_net(model: str) -> Any:
    """The model as a plain ``nn.Module``, drawn from torch's default init under `SEED`."""
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    if model == "tiny-mlp":
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3072, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, CLASSES),
    )


def _torch_data(model: str) -> tuple[list[Any], list[Any], Any, Any]:
    """`make_data`'s arrays as tensors on `DEVICE` (moved once, before the first step)."""
    import torch

    xs, ys, xe, ye = make_data(model)
    on = lambda a: torch.from_numpy(a).to(DEVICE)  # noqa: E731
    return [on(x) for x in xs], [on(y) for y in ys], on(xe), on(ye)


def _torch_plain(model: str, steps: int, members: int) -> tuple[list[float], str]:
    import torch
    from torch.nn.functional import cross_entropy

    xs_t, ys_t, xe_t, ye_t = _torch_data(model)
    finals = []
    for lr in lrs(members):
        net = torch_net(model).to(DEVICE)
        opt = torch.optim.Adam(net.parameters(), lr=float(lr), fused=True)
        for s in range(steps):
            loss = cross_entropy(net(xs_t[s % POOL]), ys_t[s % POOL])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            finals.append(float(cross_entropy(net(xe_t), ye_t)))
    return finals, "Adam(fused=True), one model at a time"


def _torch_ours(model: str, steps: int, members: int) -> tuple[list[float], str]:
    import torch

    from dualtrain_torch import BatchModule, batch_loss, member_optimizer

    xs_t, ys_t, xe_t, ye_t = _torch_data(model)
    bm = BatchModule(torch_net(model).to(DEVICE), members, init="identical", shared_input=True)
    opt = member_optimizer(bm, "adam", members, lr=lrs(members))
    for s in range(steps):
        losses = batch_loss(bm(xs_t[s % POOL]), ys_t[s % POOL], members)
        opt.zero_grad()
        losses.sum().backward()
        opt.step()
    with torch.no_grad():
        finals = batch_loss(bm(xe_t), ye_t, members)
    return [float(v) for v in finals], _strategy(bm)


def _torch_hand(model: str, steps: int, members: int) -> tuple[list[float], str]:
    """The sweep batched by hand under torch, eager.

    Forward: for the MLPs, the first layer of all members is one matmul of the shared batch
    with the members' weights side by side (``[in, members * hidden]``), the second a
    ``baddbmm``; for the CNN, ``torch.func.vmap`` over ``functional_call`` with stacked
    parameters (what torch's ensembling tutorial teaches). Loss: one cross-entropy over all
    members' outputs, times `members` (each member's mean, summed).

    Adam with one learning rate per member: ``torch.optim`` takes one rate per parameter
    group, and a group of views, one per member (``Adam(fused=True)`` over ``p[i]``, the
    gradient slices handed over each step), was slower here for the tiny MLP (5.4 against
    3.0 ms a step) and the CNN (121 against 105 ms), and wrong for the MLP's wide first layer,
    whose member slices are not contiguous (the fused step did not reach the stacked
    tensor). So Adam is written as in-place tensor ops on the stacked tensors (torch's
    formula), the rates a ``[members]`` tensor broadcast along each member axis.
    """
    import torch
    from torch.func import functional_call, vmap
    from torch.nn.functional import cross_entropy

    xs_t, ys_t, xe_t, ye_t = _torch_data(model)
    ys_t = [y.repeat(members) for y in ys_t]
    net = torch_net(model).to(DEVICE)
    m = members

    def stacked(t: torch.Tensor) -> torch.Tensor:
        return t.detach().unsqueeze(0).repeat(m, *[1] * t.dim())

    # member_axis[i]: where the member index sits in parameter i (1 for the wide first layer)
    if model == "cnn":
        params = {k: stacked(p).requires_grad_() for k, p in net.named_parameters()}
        plist, member_axis = list(params.values()), [0] * len(params)

        def member(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            return functional_call(net, p, (x,))

        def forward(x: torch.Tensor) -> torch.Tensor:
            return vmap(member, in_dims=(0, None))(params, x)

    else:
        fc1, fc2 = (layer for layer in net if isinstance(layer, torch.nn.Linear))
        hidden = fc1.out_features
        w1 = fc1.weight.detach().t().unsqueeze(1).repeat(1, m, 1).contiguous()  # [in, m, hidden]
        b1, w2, b2 = stacked(fc1.bias), stacked(fc2.weight), stacked(fc2.bias)
        plist = [t.requires_grad_() for t in (w1, b1, w2, b2)]
        member_axis = [1, 0, 0, 0]

        def forward(x: torch.Tensor) -> torch.Tensor:
            w1, b1, w2, b2 = plist
            x = x.flatten(1)
            h = (x @ w1.view(w1.shape[0], m * hidden)).view(len(x), m, hidden).transpose(0, 1)
            h = torch.relu(h + b1.unsqueeze(1))
            return torch.baddbmm(b2.unsqueeze(1), h, w2.transpose(1, 2))  # [m, B, classes]

    rates = torch.tensor(lrs(m), dtype=torch.float32, device=DEVICE)
    state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in plist]
    shaped = [_along(rates, p.dim(), axis) for p, axis in zip(plist, member_axis, strict=True)]
    for s in range(steps):
        out = forward(xs_t[s % POOL])
        loss = cross_entropy(out.flatten(0, 1), ys_t[s % POOL]) * m
        for p in plist:
            p.grad = None
        loss.backward()
        bc1, bc2 = 1 - BETAS[0] ** (s + 1), 1 - BETAS[1] ** (s + 1)
        with torch.no_grad():
            for p, (mom, var), rate in zip(plist, state, shaped, strict=True):
                g = p.grad
                assert g is not None
                mom.lerp_(g, 1 - BETAS[0])
                var.mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
                denom = var.sqrt().div_(math.sqrt(bc2)).add_(EPS).div_(rate / bc1)
                p.addcdiv_(mom, denom, value=-1.0)
    with torch.no_grad():
        out = forward(xe_t)
        target = ye_t.expand(m, -1)
        finals = cross_entropy(out.transpose(1, 2), target, reduction="none").mean(1)
    return [float(v) for v in finals], "Adam as in-place ops on stacked tensors"


def _along(rates: Any, dim: int, axis: int) -> Any:
    """`rates` shaped to broadcast along `axis` of a `dim`-dimensional tensor."""
    shape = [1] * dim
    shape[axis] = len(rates)
    return rates.view(shape)


# ---- JAX -----------------------------------------------------------------------------------


def jax_model(model: str) -> tuple[Any, Any]:
    """``(params, apply_fn)``: the model in plain ``jax.numpy``, drawn from key `SEED`.

    Init as torch's default: uniform in +-1/sqrt(fan_in) for weights and biases.
    """
    import jax
    import jax.numpy as jnp

    def uniform(key: Any, shape: tuple[int, ...], fan_in: int) -> Any:
        bound = 1 / math.sqrt(fan_in)
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound)

    if model == "cnn":
        sizes = {
            "c1": ((16, 3, 3, 3), (16,), 27),
            "c2": ((32, 16, 3, 3), (32,), 144),
            "fc": ((32, CLASSES), (CLASSES,), 32),
        }
    else:
        n_in = 64 if model == "tiny-mlp" else 3072
        sizes = {"fc1": ((n_in, 64), (64,), n_in), "fc2": ((64, CLASSES), (CLASSES,), 64)}
    keys = iter(jax.random.split(jax.random.PRNGKey(SEED), 2 * len(sizes)))
    params = {
        name: {"w": uniform(next(keys), w, fan_in), "b": uniform(next(keys), b, fan_in)}
        for name, (w, b, fan_in) in sizes.items()
    }

    def conv(x: Any, p: dict[str, Any]) -> Any:
        y = jax.lax.conv_general_dilated(
            x, p["w"], (2, 2), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW")
        )
        return jax.nn.relu(y + p["b"][None, :, None, None])

    def apply(params: dict[str, Any], x: Any) -> Any:
        if model == "cnn":
            h = conv(conv(x, params["c1"]), params["c2"]).mean(axis=(2, 3))
            return h @ params["fc"]["w"] + params["fc"]["b"]
        h = jax.nn.relu(x.reshape(len(x), -1) @ params["fc1"]["w"] + params["fc1"]["b"])
        return h @ params["fc2"]["w"] + params["fc2"]["b"]

    return params, apply


def _jax_data(model: str) -> tuple[list[Any], list[Any], Any, Any]:
    import jax.numpy as jnp

    xs, ys, xe, ye = make_data(model)
    as_x = [jnp.asarray(x) for x in xs]
    as_y = [jnp.asarray(y, jnp.int32) for y in ys]  # JAX without x64 takes int32 labels
    return as_x, as_y, jnp.asarray(xe), jnp.asarray(ye, jnp.int32)


def _jax_step_parts(apply: Any) -> tuple[Any, Any]:
    """The optax Adam with an injected learning rate, and one member's train step."""
    import jax
    import optax

    tx = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3, b1=BETAS[0], b2=BETAS[1])

    def loss_fn(params: Any, x: Any, y: Any) -> Any:
        return optax.softmax_cross_entropy_with_integer_labels(apply(params, x), y).mean()

    def step(params: Any, opt_state: Any, x: Any, y: Any) -> tuple[Any, Any]:
        grads = jax.grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return tx, step


def _jax_plain(model: str, steps: int, members: int) -> tuple[list[float], str]:
    import jax
    import jax.numpy as jnp
    import optax

    xs, ys, xe, ye = _jax_data(model)
    init, apply = jax_model(model)
    tx, step_fn = _jax_step_parts(apply)
    traces = []

    def counted(*args: Any) -> Any:
        traces.append(1)  # runs when jit traces: once if the rate is a true argument
        return step_fn(*args)

    step = jax.jit(counted)
    evaluate = jax.jit(
        lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(apply(p, x), y).mean()
    )
    finals = []
    for lr in lrs(members):
        params = init
        opt_state = tx.init(params)
        # same dtype and weak type as the value init stored, so the step compiles once
        old = opt_state.hyperparams["learning_rate"]
        opt_state.hyperparams["learning_rate"] = jnp.asarray(lr, old.dtype)
        for s in range(steps):
            params, opt_state = step(params, opt_state, xs[s % POOL], ys[s % POOL])
        finals.append(float(evaluate(params, xe, ye)))
    return finals, f"step traced {len(traces)}x"


def _jax_ours(model: str, steps: int, members: int) -> tuple[list[float], str]:
    import jax
    import optax

    from dualtrain_jax import BatchModule, batch_loss, member_optimizer

    xs, ys, xe, ye = _jax_data(model)
    bm = BatchModule(jax_model(model), members, init="identical", shared_input=True)
    tx = member_optimizer("adam", members, lr=lrs(members))
    opt_state = tx.init(bm.params)
    bm.tune(xs[0])  # measure the strategy now, outside jit

    @jax.jit
    def step(params: Any, opt_state: Any, x: Any, y: Any) -> tuple[Any, Any]:
        def loss(params: Any) -> Any:
            out, _ = bm.apply(params, bm.state, x)
            return batch_loss(out, y, members).sum()

        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for s in range(steps):
        bm.params, opt_state = step(bm.params, opt_state, xs[s % POOL], ys[s % POOL])
    out, _ = bm.apply(bm.params, bm.state, xe)
    return [float(v) for v in batch_loss(out, ye, members)], _strategy(bm)


def _jax_hand(model: str, steps: int, members: int) -> tuple[list[float], str]:
    """``jax.vmap`` of the one-member optax step over stacked params, states and rates."""
    import jax
    import jax.numpy as jnp
    import optax

    xs, ys, xe, ye = _jax_data(model)
    init, apply = jax_model(model)
    tx, step_fn = _jax_step_parts(apply)
    params = jax.tree.map(lambda p: jnp.broadcast_to(p, (members, *p.shape)), init)
    opt_state = jax.vmap(tx.init)(params)
    old = opt_state.hyperparams["learning_rate"]
    opt_state.hyperparams["learning_rate"] = jnp.asarray(lrs(members), old.dtype)
    step = jax.jit(jax.vmap(step_fn, in_axes=(0, 0, None, None)))
    for s in range(steps):
        params, opt_state = step(params, opt_state, xs[s % POOL], ys[s % POOL])
    losses = jax.vmap(
        lambda p: optax.softmax_cross_entropy_with_integer_labels(apply(p, xe), ye).mean()
    )(params)
    return [float(v) for v in losses], "vmap of the jitted optax step"


RUNNERS = {
    ("torch", "plain"): _torch_plain,
    ("torch", "ours"): _torch_ours,
    ("torch", "hand"): _torch_hand,
    ("jax", "plain"): _jax_plain,
    ("jax", "ours"): _jax_ours,
    ("jax", "hand"): _jax_hand,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one learning-rate sweep, one way")
    parser.add_argument("--framework", choices=FRAMEWORKS, required=True)
    parser.add_argument("--way", choices=WAYS, required=True)
    parser.add_argument("--model", choices=tuple(MODELS), required=True)
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps per member")
    parser.add_argument("--members", type=int, default=MEMBERS)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="torch: where the models train (JAX: JAX_PLATFORMS)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.steps < 1 or args.members < 2:
        parser.error(f"--steps must be >= 1 and --members >= 2; got {args.steps}, {args.members}")
    start = time.perf_counter()
    # The framework's own import is the same for every way; what follows it is the
    # training a way's choices change ("work_s": bench_jobs' second ratio).
    if args.framework == "torch":
        import torch  # noqa: F401
    else:
        import jax  # noqa: F401
        import optax  # noqa: F401
    loaded = time.perf_counter()
    global DEVICE
    DEVICE = args.device
    result, detail = RUNNERS[args.framework, args.way](args.model, args.steps, args.members)
    summary = {
        "result": result,
        "framework": args.framework,
        "way": args.way,
        "model": args.model,
        "steps": args.steps,
        "detail": detail,
        "main_s": time.perf_counter() - start,
        "work_s": time.perf_counter() - loaded,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
