"""`dualtrain demo`: what dualtrain does today, end to end, on data made on the spot.

It lists the backends found, moves a pytree NumPy -> torch -> JAX -> NumPy counting the
copies, and trains one small MLP in torch and in JAX from the same data and the same initial
weights, printing the two loss curves side by side. Adapters are reached only through
`dualtrain.backends`; no data or weights are downloaded.
"""

from __future__ import annotations

import importlib.metadata
import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dualtrain import backends
from dualtrain.interop import convert, count_copies
from dualtrain.memory import aligned_empty

__all__ = ["TRAIN_MLP_CONTRACT", "make_data", "run"]

TRAIN_MLP_CONTRACT = """
``train_mlp(params, x, y, *, lr, steps) -> list[float]``, in each adapter's ``demo`` module:
full-batch SGD on a tanh MLP with softmax cross-entropy, returning the loss before each step.
``params`` holds ``w1 (in, hidden)``, ``b1 (hidden,)``, ``w2 (hidden, classes)`` and
``b2 (classes,)`` as float32 NumPy arrays; ``x`` is ``(n, in)`` float32, ``y`` is ``(n,)``
int32 class labels. Both adapters compute the same maths, so the losses agree to float32
rounding.
"""


def make_data(
    seed: int, n: int = 512, features: int = 16, classes: int = 4, hidden: int = 32
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Gaussian blobs and initial MLP weights, as 64-byte aligned float32 host arrays.

    Returns:
        ``x (n, features)`` float32, ``y (n,)`` int32 and the weights ``w1 (features,
        hidden)``, ``b1 (hidden,)``, ``w2 (hidden, classes)``, ``b2 (classes,)``.
    """
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 2.0, size=(classes, features))
    y = rng.integers(0, classes, size=n).astype(np.int32)
    x = centers[y] + rng.normal(0.0, 1.0, size=(n, features))
    shapes = {"w1": (features, hidden), "b1": (hidden,), "w2": (hidden, classes), "b2": (classes,)}
    params = {}
    for name, shape in shapes.items():
        scale = 1.0 / np.sqrt(shape[0]) if len(shape) == 2 else 0.0
        params[name] = _aligned(rng.normal(0.0, 1.0, size=shape) * scale)
    return _aligned(x), _aligned(y, np.int32), params


def _aligned(values: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    out = aligned_empty(values.shape, dtype)
    out[...] = values
    return out


def run(seed: int = 0, steps: int = 60, lr: float = 0.3, console: Console | None = None) -> dict:
    """Runs the demo and returns what it showed (for tests): copies, losses, timings."""
    console = console or Console()
    started = time.perf_counter()
    console.rule("[bold]dualtrain demo")
    _show_backends(console)
    x, y, params = make_data(seed)
    copies = _show_exchange(console, x, y, params)
    torch_losses, jax_losses, seconds = _show_training(console, x, y, params, lr, steps)
    total = time.perf_counter() - started
    console.print(f"demo finished in {total:.1f} s")
    return {
        "copies": copies,
        "torch_losses": torch_losses,
        "jax_losses": jax_losses,
        "train_seconds": seconds,
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
    console: Console, x: np.ndarray, y: np.ndarray, params: dict, lr: float, steps: int
) -> tuple[list[float], list[float], dict[str, float]]:
    losses, seconds = {}, {}
    for name in ("torch", "jax"):
        started = time.perf_counter()
        losses[name] = backends.load_part(name, "demo").train_mlp(params, x, y, lr=lr, steps=steps)
        seconds[name] = time.perf_counter() - started
    table = Table(title=f"the same MLP, data and weights: {steps} full-batch SGD steps, lr={lr}")
    for column in ("step", "torch loss", "JAX loss", "|difference|"):
        table.add_column(column, justify="right")
    for i in sorted({*range(0, steps, max(1, steps // 6)), steps - 1}):
        a, b = losses["torch"][i], losses["jax"][i]
        table.add_row(str(i), f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.1e}")
    console.print(table)
    console.print(
        f"torch {seconds['torch']:.2f} s, JAX {seconds['jax']:.2f} s (JAX includes its jit)"
    )
    return losses["torch"], losses["jax"], seconds
