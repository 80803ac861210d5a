"""DashBoard: what `gauge` costs per step on a ~10 ms training step, against a bare loop and tqdm.

The step: an MLP (batch 128, two hidden layers, width chosen at start-up so that one
forward + backward + SGD update takes about 10 ms on this machine) under torch, and the
same under JAX (one jitted step). One timed call is an epoch of 50 steps.

- bare: the loop alone; the loss stays a device scalar, never read.
- tqdm: ``tqdm(..., file=os.devnull)`` with ``set_postfix(loss=float(loss))`` every step,
  the usual way (a host read of the loss every step).
- dualtrain, float: ``dash.gauge({"loss": float(loss)}, ...)`` every step.
- dualtrain, device scalar: ``dash.gauge({"loss": loss}, ..., interval=10)``: the loss is
  read every 10 steps only.

The dashboard draws its live display (rich, on a terminal console writing to os.devnull),
so its redraw thread's cost is included. Overhead per step = (time - bare time) / 50, as a
share of the bare step; the rows "alone" time gauge on an empty loop, as a share of 10 ms.
Target: <= 1% of the step.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import harness

STEPS, BATCH = 50, 128


def _console() -> Any:
    from rich.console import Console

    return Console(file=open(os.devnull, "w"), force_terminal=True, width=120)


def _torch_step(width: int) -> Any:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, 10),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, 256), torch.randint(0, 10, (BATCH,))

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _jax_step(width: int) -> Any:
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 3)
    sizes = [(256, width), (width, width), (width, 10)]
    params = [jax.random.normal(k, s) * 0.05 for k, s in zip(keys, sizes, strict=True)]
    x = jax.random.normal(jax.random.key(1), (BATCH, 256))
    y = jax.random.randint(jax.random.key(2), (BATCH,), 0, 10)

    def loss_fn(ps: Any) -> Any:
        h = x
        for w in ps[:-1]:
            h = jax.nn.relu(h @ w)
        logits = h @ ps[-1]
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(BATCH), y])

    @jax.jit
    def update(ps: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(ps)
        return [p - 0.01 * g for p, g in zip(ps, grads, strict=True)], loss

    state = {"params": params}

    def step() -> Any:
        state["params"], loss = update(state["params"])
        return loss

    return step


def _width(make: Any, sync: Any) -> tuple[int, float]:
    """The hidden width whose step is closest to 10 ms here, and that step's seconds."""
    best = (0, 0.0)
    for width in (256, 512, 768, 1024, 1536, 2048):
        step = make(width)
        for _ in range(3):
            sync(step())
        started = time.perf_counter()
        for _ in range(10):
            sync(step())
        seconds = (time.perf_counter() - started) / 10
        if not best[0] or abs(seconds - 0.01) < abs(best[1] - 0.01):
            best = (width, seconds)
    return best


def _epochs(step: Any, sync: Any) -> dict[str, Any]:
    from tqdm import tqdm

    from dualtrain import DashBoard

    def bare() -> None:
        loss = None
        for _ in range(STEPS):
            loss = step()
        sync(loss)

    def with_tqdm() -> None:
        bar = tqdm(range(STEPS), file=open(os.devnull, "w"), leave=False)  # noqa: SIM115
        for _ in bar:
            bar.set_postfix(loss=float(step()))
        bar.close()

    dash_float = DashBoard(console=_console())
    dash_device = DashBoard(console=_console())
    epoch = [0, 0]

    def gauge_float() -> None:
        epoch[0] += 1
        for mile in range(1, STEPS + 1):
            dash_float.gauge({"loss": float(step())}, mile, epoch[0], STEPS, "train")

    def gauge_device() -> None:
        epoch[1] += 1
        for mile in range(1, STEPS + 1):
            dash_device.gauge({"loss": step()}, mile, epoch[1], STEPS, "train", interval=10)

    return {
        "bare": bare, "tqdm": with_tqdm, "float": gauge_float, "device": gauge_device,
        "close": lambda: (dash_float.close(), dash_device.close()),
    }  # fmt: skip


def _alone(args: Any) -> list[Any]:
    """`gauge` itself, on a step that does nothing: its cost without the training's noise."""
    import torch

    from dualtrain import DashBoard

    loss = torch.tensor(0.5)
    out = []
    for label, interval, value in (
        ("gauge(float) every step", 1, 0.5),
        ("gauge(device scalar, interval=10)", 10, loss),
    ):
        dash, epoch = DashBoard(console=_console()), [0]

        def bare() -> None:
            for _ in range(STEPS):
                pass

        def gauged(dash: Any = dash, epoch: list[int] = epoch, interval: int = interval,
                   value: Any = value) -> None:  # fmt: skip
            epoch[0] += 1
            for mile in range(1, STEPS + 1):
                dash.gauge({"loss": value, "acc": value}, mile, epoch[0], STEPS, "train",
                           interval=interval)  # fmt: skip

        row = harness.compare(
            f"{label}, 2 metrics, alone (no training)", baseline_name="empty loop",
            baseline=bare, ours=gauged, quick=args.quick,
        )  # fmt: skip
        per_step = (row.ours.median - row.base.median) / STEPS
        row.extra["overhead/step"] = f"{per_step * 1e6:.1f} µs"
        row.extra["% of step"] = f"{100 * per_step / 0.01:.2f}% of 10 ms"
        out.append(row)
        dash.close()
    return out


def main() -> None:
    args = harness.parse_args("dashboard")
    import jax
    import torch

    harness.set_torch_threads(args.threads)
    rows = []
    cases = [
        ("torch", _torch_step, lambda t: t),  # CPU torch runs eagerly: nothing to wait for
        ("JAX", _jax_step, lambda x: jax.block_until_ready(x)),
    ]
    for name, make, sync in cases:
        width, step_s = _width(make, sync)
        loops = _epochs(make(width), sync)
        for label, base_key, ours_key in (
            ("gauge(float) vs bare loop", "bare", "float"),
            ("gauge(device scalar, interval=10) vs bare loop", "bare", "device"),
            ("gauge(float) vs tqdm + set_postfix", "tqdm", "float"),
            ("gauge(device scalar, interval=10) vs tqdm + set_postfix", "tqdm", "device"),
        ):
            row = harness.compare(
                f"{name}, {step_s * 1e3:.1f} ms step (width {width}): {label}",
                baseline_name={"bare": "bare loop", "tqdm": "tqdm"}[base_key],
                baseline=loops[base_key], ours=loops[ours_key], quick=args.quick, warmup=1,
            )  # fmt: skip
            per_step = (row.ours.median - row.base.median) / STEPS
            row.extra["overhead/step"] = f"{per_step * 1e6:.1f} µs"
            row.extra["% of step"] = f"{100 * per_step / step_s:.2f}%"
            rows.append(row)
        loops["close"]()
    rows += _alone(args)
    harness.report("dashboard", rows, args, steps_per_call=STEPS, batch=BATCH,
                   torch=torch.__version__, jax=jax.__version__)  # fmt: skip


if __name__ == "__main__":
    main()
