"""`dualtrain demo`: what dualtrain does today, end to end, on data made on the spot.

It lists the backends found, moves a pytree NumPy -> torch -> JAX -> NumPy counting the
copies, trains one Craft (a small MLP with BatchNorm) in torch and in JAX from the same data
and the same seed, printing the two loss curves side by side, then drops the torch model's
checkpoint and loads it into a fresh JAX module, which then predicts what torch does.
It sweeps eight learning rates as one batched model under both. Then it packs synthetic
images into a Fuel pack and trains from a preloading Tank under both, trains a user x item
factorization from two host-memory EmbeddingStores under both, and last trains one Craft
data-parallel on two workers (Multiverse) under both. Adapters are
reached only through `dualtrain.backends`; nothing is downloaded.
"""

from __future__ import annotations

import importlib.metadata
import tempfile
import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dualtrain import backends
from dualtrain.checkpoint import TimeMachine
from dualtrain.craft import Craft, dock
from dualtrain.demo.table import loss_table
from dualtrain.interop import convert, count_copies
from dualtrain.memory import aligned_empty

__all__ = ["TRAIN_CONTRACT", "DemoNet", "make_data", "run"]

TRAIN_CONTRACT = """
``train(craft, x, y, *, lr, steps, seed) -> (losses, module)``, in each adapter's ``demo``
module: realize `craft` with `seed`, then run `steps` full-batch SGD steps of softmax
cross-entropy in training mode, returning the loss before each step and the trained module.
``x`` is ``(n, in)`` float32, ``y`` is ``(n,)`` int32 class labels. Both adapters compute
the same maths from the same initial weights, so the losses agree to float32 rounding.
"""


class DemoNet(Craft):
    """The demo's model: Dense -> BatchNorm -> tanh -> Dense."""

    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__("DEMO")
        self.fc1 = dock.Dense(features, hidden)
        self.bn = dock.BatchNorm(hidden)
        self.fc2 = dock.Dense(hidden, classes)

    def run(self, x: Any) -> Any:
        return self.fc2(dock.tanh(self.bn(self.fc1(x))))


def make_data(
    seed: int, n: int = 512, features: int = 16, classes: int = 4
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Gaussian blobs and the demo model's initial weights, as aligned host arrays.

    Returns:
        ``x (n, features)`` float32, ``y (n,)`` int32 and DemoNet's initial parameters.
    """
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, size=(classes, features))
    y = rng.integers(0, classes, size=n).astype(np.int32)
    x = centers[y] + rng.normal(0.0, 1.0, size=(n, features))
    params = DemoNet(features, classes=classes).init(seed)
    return _aligned(x), _aligned(y, np.int32), params


def _aligned(values: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    out = aligned_empty(values.shape, dtype)
    out[...] = values
    return out


def run(
    seed: int = 0,
    steps: int = 60,
    lr: float = 0.3,
    console: Console | None = None,
    nworld: int = 2,
) -> dict:
    """Runs the demo and returns what it showed (for tests): copies, losses, timings.

    `nworld` workers train in the Multiverse part (1 leaves it out).
    """
    console = console or Console()
    started = time.perf_counter()
    console.rule("[bold]dualtrain demo")
    _show_backends(console)
    x, y, params = make_data(seed)
    copies = _show_exchange(console, x, y, params)
    craft = DemoNet(x.shape[1], classes=int(y.max()) + 1)
    losses, modules, seconds = _show_training(console, craft, x, y, lr, steps, seed)
    crossing = _show_checkpoint(console, modules, x)
    from dualtrain.demo.embeddings import run_embeddings  # rich and Pillow only when run
    from dualtrain.demo.fuel import run_fuel
    from dualtrain.demo.sweep import run_sweep

    sweep = run_sweep(console, craft, x, y, seed, steps=min(steps, 30))
    fuel = run_fuel(console, seed)
    embeddings = run_embeddings(console, seed)
    parallel: dict[str, Any] = {}
    if nworld > 1:
        from dualtrain.demo.multiverse import run_multiverse

        parallel = run_multiverse(console, seed, nworld)
    total = time.perf_counter() - started
    console.print(f"demo finished in {total:.1f} s")
    return {
        "copies": copies,
        "torch_losses": losses["torch"],
        "jax_losses": losses["jax"],
        "train_seconds": seconds,
        "checkpoint_max_difference": crossing,
        **sweep,
        **fuel,
        **embeddings,
        **parallel,
    }


def _show_backends(console: Console) -> None:
    table = Table(title="backends found")
    table.add_column("backend")
    table.add_column("version")
    for name in backends.available():
        dist = {"numpy": "numpy", "torch": "torch", "jax": "jax", "cupy": "cupy-cuda12x"}[name]
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        table.add_row(name, version)
    console.print(table)


def _show_exchange(console: Console, x: np.ndarray, y: np.ndarray, params: dict) -> int:
    batch = {"x": x, "y": y, "params": params}
    table = Table(title="one pytree, NumPy -> torch -> JAX -> NumPy")
    for column in ("step", "leaves", "copies", "same memory as the NumPy original"):
        table.add_column(column)
    leaves = 2 + len(params)
    total = 0
    current: Any = batch
    for target in ("torch", "jax", "numpy"):
        with count_copies() as count:
            current = convert(current, to=target)
        total += count.copies
        shared = _address(current["x"], target) == x.ctypes.data
        table.add_row(f"-> {target}", str(leaves), str(count.copies), "yes" if shared else "no")
    console.print(table)
    same = all(np.array_equal(current["params"][k], v) for k, v in params.items())
    console.print(f"round trip bit-exact: {same}; copies made: {total}")
    return total


def _address(array: Any, framework: str) -> int:
    if framework == "torch":
        return int(array.data_ptr())
    if framework == "jax":
        return int(array.unsafe_buffer_pointer())
    return int(array.ctypes.data)


def _show_training(
    console: Console, craft: Craft, x: np.ndarray, y: np.ndarray, lr: float, steps: int, seed: int
) -> tuple[dict[str, list[float]], dict[str, Any], dict[str, float]]:
    losses, modules, seconds = {}, {}, {}
    for name in ("torch", "jax"):
        started = time.perf_counter()
        part = backends.load_part(name, "demo")
        losses[name], modules[name] = part.train(craft, x, y, lr=lr, steps=steps, seed=seed)
        seconds[name] = time.perf_counter() - started
    title = f"one Craft, realized twice: {steps} full-batch SGD steps, lr={lr}"
    console.print(loss_table(title, "step", losses, rows=6))
    console.print(
        f"torch {seconds['torch']:.2f} s, JAX {seconds['jax']:.2f} s (JAX includes its jit)"
    )
    return losses, modules, seconds


def _show_checkpoint(console: Console, modules: dict[str, Any], x: np.ndarray) -> float:
    """Drops the torch model, loads it into a fresh JAX module, compares their predictions."""
    with tempfile.TemporaryDirectory() as folder:
        tm = TimeMachine(ckpt_path=folder, save_path=folder)
        anchor = tm.drop(modules["torch"], step=len(x))
        fresh = backends.load_part("jax", "craft").realize(modules["jax"].craft, seed=12345)
        skipped = tm.to(fresh, frozen=True)
        torch_module = modules["torch"]
        torch_module.eval()
        expected = convert(torch_module(convert(x, to="torch")), to="numpy")
        got = convert(fresh(convert(x, to="jax")), to="numpy")
    difference = float(np.abs(expected - got).max())
    console.print(
        f"checkpoint {anchor.name}: written by torch, loaded into a fresh JAX module "
        f"({len(skipped)} skipped); eval predictions differ by at most {difference:.1e}"
    )
    return difference
