"""How an anchor fits a model: names, shapes and dtype kinds, compared before anything loads.

A shape is never broadcast (``(1,)`` on disk does not fit ``(16,)``); dtypes cast within
their kind (float32 <-> bfloat16), never across (float -> int); torch's bookkeeping buffers
are neither required nor reported where one side lacks them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dualtrain import dtypes
from dualtrain.checkpoint.anchor_file import Anchor
from dualtrain.errors import CheckpointError

__all__ = ["BOOKKEEPING", "Restored", "Spec", "check_rng", "compare", "few", "in_scope", "select"]

# Framework bookkeeping that one realization keeps and the other has no place for: torch's
# BatchNorm counts its training batches in ``num_batches_tracked``; JAX's keeps no count (with
# dock's float momentum the count changes no output). Saved and restored where both the file
# and the model have it; neither required nor reported where one side lacks it.
BOOKKEEPING = frozenset({"num_batches_tracked"})


def _bookkeeping(name: str) -> bool:
    return name.rpartition(".")[2] in BOOKKEEPING


Spec = tuple[tuple[int, ...], np.dtype]


def compare(model: dict[str, Spec], saved: dict[str, Spec], frozen: bool, path: Path) -> list[str]:
    """Names to skip; with `frozen`, a CheckpointError naming each problem.

    A shape is never broadcast: ``(1,)`` on disk does not fit ``(16,)``. Dtypes cast within
    their kind (float32 <-> bfloat16), never across (float -> int).
    """
    problems, skipped = [], []
    for name, (shape, dtype) in model.items():
        if name not in saved:
            if _bookkeeping(name):
                continue
            problems.append(f"{name} is in the model but not in {path.name}")
            skipped.append(name)
            continue
        disk_shape, disk_dtype = saved[name]
        if tuple(disk_shape) != tuple(shape):
            problems.append(
                f"{name} is {tuple(disk_shape)} on disk but {tuple(shape)} in the model"
            )
            skipped.append(name)
        elif dtypes.kind(disk_dtype) != dtypes.kind(dtype):
            problems.append(f"{name} is {disk_dtype.name} on disk but {dtype.name} in the model")
            skipped.append(name)
    for name in saved:
        if name not in model and not _bookkeeping(name):
            problems.append(f"{name} is in {path.name} but not in the model")
            skipped.append(name)
    if frozen and problems:
        raise CheckpointError("frozen load refused: " + "; ".join(problems))
    return skipped


def check_rng(part: Any, anchor: Anchor) -> None:
    """A stored RNG state must have the form of the framework's (else it would fail late)."""
    current = part.export_rng()
    entry = anchor.entries["__rng__"]
    if current is not None and (entry.shape != current.shape or entry.dtype != current.dtype):
        raise anchor.error(
            f"holds an RNG state {entry.shape} {entry.dtype.name}; this framework's is "
            f"{current.shape} {current.dtype.name}"
        )


def few(names: Any, n: int = 5) -> str:
    """A few of `names` for a message: ``'a', 'b', ... (12 in all)``."""
    listed = sorted(names)
    shown = ", ".join(repr(k) for k in listed[:n])
    if not listed:
        return "it holds none"
    return f"it holds {shown}" + (f", ... ({len(listed)} in all)" if len(listed) > n else "")


def in_scope(name: str, scope: str | None) -> bool:
    """Whether `name` is `scope` or under it (every name is, for None)."""
    return scope is None or name == scope or name.startswith(scope + ".")


def select(tensors: dict[str, Any], scope: str | None) -> dict[str, Any]:
    """The entries of `tensors` named `scope` or under it (all of them for None)."""
    return {k: v for k, v in tensors.items() if in_scope(k, scope)}


class Restored(list):
    """What `TimeMachine.to` skipped (a list of names), plus what else it restored.

    Attributes:
        file: the anchor read.
        step: the step recorded at `drop`, or None.
        extra: the `extra` dict recorded at `drop`.
        optimizer: the optimizer given to `to`, loaded (torch: the same object; optax: a new
            state, since JAX state is immutable), or None.
        manifest: the whole manifest.
    """

    file: Path
    step: int | None
    extra: dict[str, Any]
    optimizer: Any
    manifest: dict[str, Any]
