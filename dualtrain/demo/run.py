"""`dualtrain demo`: the whole library end to end, on data made on the spot.

It lists the backends found and moves a pytree NumPy -> torch -> JAX -> NumPy counting the
copies. Then the pipeline (`dualtrain.demo.pipeline`): pictures drawn by Pillow are packed
by FuelGenerator and served by Tanks (augmented, preloaded) to one Craft trained a few epochs
under each framework through its compile ladder, with a live DashBoard writing CSV and PNG
curves; every held-out row is evaluated once; the torch model's checkpoint, loaded into a
fresh JAX module, predicts the same. One Craft trained full-batch under both shows the two
loss curves agree to rounding. Last: eight learning rates as one batched model, a user x
item factorization from two host-memory EmbeddingStores, and one Craft data-parallel on
`nworld` workers (Multiverse). Adapters are reached only through `dualtrain.backends`;
nothing is downloaded.
"""

from __future__ import annotations

import importlib.metadata
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dualtrain import backends
from dualtrain.craft import Craft, dock
from dualtrain.demo.seams import demo_part
from dualtrain.demo.table import loss_table
from dualtrain.errors import bad_argument
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
    *,
    backend: str = "both",
    out: str | os.PathLike[str] = "dualtrain-demo",
    epochs: int | None = None,
    quick: bool = False,
) -> dict:
    """Runs the demo and returns what it showed (for tests): losses, accuracies, files.

    Args:
        seed: the seed of the data made and of the weights.
        steps: full-batch SGD steps of the one-Craft comparison (both frameworks only).
        lr: its learning rate.
        console: where to draw (default: stdout's).
        nworld: Multiverse workers (1 leaves that part out).
        backend: "torch", "jax" or "both".
        out: the folder for the packs (data/), the DashBoard's logs (aerolog/) and the
            checkpoints (ckpt/).
        epochs: epochs of the image pipeline (default 5; 4 with `quick`).
        quick: smaller data and fewer steps everywhere (the test suite's run).
    """
    if backend not in ("torch", "jax", "both"):
        raise bad_argument("backend", backend, "'torch', 'jax' or 'both'")
    names = ("torch", "jax") if backend == "both" else (backend,)
    epochs = epochs if epochs is not None else (4 if quick else 5)
    console = console or Console()
    folder = Path(out)
    started = time.perf_counter()
    console.rule("[bold]dualtrain demo")
    _show_backends(console)
    from dualtrain.demo.pipeline import describe, run_pipeline  # the parts load when run

    shown: dict[str, Any] = {"names": names}
    if len(names) == 2:
        x, y, params = make_data(seed)
        shown["copies"] = _show_exchange(console, x, y, params)
    console.rule("images -> FuelGenerator -> Tank -> one Craft, trained and evaluated")
    shown["pipeline"] = run_pipeline(console, folder, names, epochs=epochs, seed=seed,
                                     quick=quick)  # fmt: skip
    from dualtrain.demo.embeddings import run_embeddings
    from dualtrain.demo.sweep import run_sweep

    x, y, _ = make_data(seed)
    craft = DemoNet(x.shape[1], classes=int(y.max()) + 1)
    if len(names) == 2:
        losses, _, seconds = _show_training(console, craft, x, y, lr, steps, seed)
        shown.update(torch_losses=losses["torch"], jax_losses=losses["jax"],
                     train_seconds=seconds)  # fmt: skip
    console.rule("model batching, embedding store, data-parallel")
    shown.update(run_sweep(console, craft, x, y, seed, steps=12 if quick else 30, names=names))
    shown.update(run_embeddings(console, seed, steps=50 if quick else 150, names=names))
    if nworld > 1:
        from dualtrain.demo.multiverse import run_multiverse

        shown.update(run_multiverse(console, seed, nworld, steps=30 if quick else 60,
                                    names=names))  # fmt: skip
    console.rule("outputs")
    describe(console, folder, shown["pipeline"])
    console.print(f"demo finished in {time.perf_counter() - started:.1f} s")
    return shown


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
        part = demo_part(name)
        losses[name], modules[name] = part.train(craft, x, y, lr=lr, steps=steps, seed=seed)
        seconds[name] = time.perf_counter() - started
    title = f"one Craft, realized twice: {steps} full-batch SGD steps, lr={lr}"
    console.print(loss_table(title, "step", losses, rows=6))
    console.print(
        f"torch {seconds['torch']:.2f} s, JAX {seconds['jax']:.2f} s (JAX includes its jit)"
    )
    return losses, modules, seconds
