"""TimeMachine's embedding half: a trained EmbeddingStore as one safetensors anchor.

The anchor holds the table, every optimizer-state table and (exact mode) the per-row step
counters, each cut into chunks of `CHUNK` rows so that no step of saving or loading needs
a second copy of a table (safetensors writes straight from the arrays' memory; loading
copies one chunk at a time into the store). State slots go by torch's names (exp_avg,
exp_avg_sq, momentum_buffer, sum, ...), which the JAX attachment also uses, so either
framework resumes what the other saved. The step count and hyper-parameters are in the
manifest. Written to a temporary name and renamed, like every anchor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import safetensors

from dualtrain.aerolog.time_machine import CheckpointError, _manifest, _write_atomic
from dualtrain.errors import bad_argument

__all__ = ["CHUNK", "FORMAT", "load_rows", "save_rows"]

FORMAT = "dualtrain-embeddings/1"
CHUNK = 1 << 16  # rows per tensor: 32 MiB of a 128-wide float32 table


def _chunks(name: str, table: np.ndarray) -> dict[str, np.ndarray]:
    return {f"{name}.{i // CHUNK}": table[i : i + CHUNK] for i in range(0, len(table), CHUNK)}


def _session(rows: Any) -> Any:
    session = getattr(rows, "session", None)
    if session is None or not hasattr(rows, "store"):
        raise bad_argument(
            "rows",
            type(rows).__name__,
            "what dualtrain_torch.attach or dualtrain_jax.attach returned",
        )
    return session


def save_rows(rows: Any, path: Path, extra: dict[str, Any] | None = None) -> Path:
    """Writes the store behind `rows` (an attachment) with its optimizer state to `path`."""
    session = _session(rows)
    store = rows.store
    session.flush()
    tensors = _chunks("weight", store.table)
    for slot, table in store.state.items():
        tensors.update(_chunks(f"state.{slot}", table))
    if store.counters is not None:
        tensors.update(_chunks("counters", store.counters))
    manifest = {
        "format": FORMAT,
        "backend": type(rows).__module__.split(".")[0],
        "num_rows": store.num_rows,
        "dim": store.dim,
        "dtype": store.dtype,
        "chunk": CHUNK,
        "slots": sorted(store.state),
        "mode": session.mode,
        "step": session.t,
        "hyper": rows.hyper,
        "extra": extra or {},
    }
    # Hyper-parameters JSON cannot hold (a tensor lr, a schedule) are recorded by repr.
    _write_atomic(path, tensors, {"dualtrain": json.dumps(manifest, default=repr)})
    return path


def load_rows(rows: Any, path: Path) -> dict[str, Any]:
    """Loads an anchor written by `save_rows` (under either framework) into `rows`' store.

    Returns the manifest. Raises CheckpointError when the table's shape differs or the
    attachment's optimizer keeps a state table the anchor lacks.
    """
    session = _session(rows)
    store = rows.store
    manifest = _manifest(path, FORMAT)
    if (manifest["num_rows"], manifest["dim"]) != (store.num_rows, store.dim):
        raise CheckpointError(
            f"{path} holds a {manifest['num_rows']} x {manifest['dim']} table; this store is "
            f"{store.num_rows} x {store.dim}"
        )
    missing = sorted(set(store.state) - set(manifest["slots"]))
    if missing:
        raise CheckpointError(
            f"{path} has no state {missing} for this optimizer; it holds {manifest['slots']}"
        )
    session.flush()
    session.prefetched = session.current = None
    targets = {"weight": store.table, **{f"state.{k}": v for k, v in store.state.items()}}
    saved_counters = manifest["mode"] == "exact"
    if store.counters is not None and saved_counters:
        targets["counters"] = store.counters
    with safetensors.safe_open(str(path), framework="numpy") as f:
        for name, table in targets.items():
            for i in range(0, len(table), CHUNK):
                table[i : i + CHUNK] = f.get_tensor(f"{name}.{i // CHUNK}")
    if store.counters is not None and not saved_counters:
        store.counters[...] = manifest["step"]  # a lazy run's rows count as current
    session.t = int(manifest["step"])
    return manifest
