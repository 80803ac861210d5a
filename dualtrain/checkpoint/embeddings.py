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

import re
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain import dtypes
from dualtrain.checkpoint.anchor_file import (
    Anchor,
    check_extra,
    check_header,
    numpy_scalars,
    write_anchor,
)
from dualtrain.checkpoint.vocabulary import (
    EMBEDDINGS_FORMAT,
    EMBEDDINGS_READS,
    WITHOUT_CRC,
    backend_name,
    upgrade,
)
from dualtrain.errors import CheckpointError, bad_argument

__all__ = [
    "CHUNK",
    "FORMAT",
    "LEGACY_FORMATS",
    "OLDER_FORMATS",
    "backend_of",
    "check_chunks",
    "check_fit",
    "checked_manifest",
    "load_rows",
    "optimizer_name",
    "save_rows",
    "session_of",
]

FORMAT = EMBEDDINGS_FORMAT
# Older formats that still load: with their CRC-32s (OLDER; /2 named the backend by its
# package, "dualtrain_torch"), or before them and the optimizer's name (LEGACY).
OLDER_FORMATS = tuple(f for f in EMBEDDINGS_READS[1:] if f not in WITHOUT_CRC)
LEGACY_FORMATS = tuple(f for f in EMBEDDINGS_READS[1:] if f in WITHOUT_CRC)
CHUNK = 1 << 16  # rows per tensor: 32 MiB of a 128-wide float32 table
MODES = ("lazy", "exact")


def _chunks(name: str, table: np.ndarray) -> dict[str, np.ndarray]:
    return {f"{name}.{i // CHUNK}": table[i : i + CHUNK] for i in range(0, len(table), CHUNK)}


def session_of(rows: Any) -> Any:
    """The RowSession of `rows`, an attachment (ArgumentError naming `rows` otherwise)."""
    session = getattr(rows, "session", None)
    if session is None or not hasattr(rows, "store"):
        raise bad_argument(
            "rows",
            type(rows).__name__,
            "what dualtrain_torch.attach or dualtrain_jax.attach returned",
        )
    return session


def backend_of(rows: Any) -> str:
    """The registry's name of the framework that trains `rows`: ``"torch"`` or ``"jax"``."""
    return str(backend_name(type(rows).__module__.split(".")[0]))


def optimizer_name(rows: Any) -> str:
    """What optimizer trains `rows`: torch's class, or the structure of optax's state.

    Two optimizers with the same slot names (RMSprop's and SGD's ``momentum_buffer``) keep
    different things in them; the name tells them apart at load.
    """
    rows = getattr(rows, "local", rows)  # a shard's: the attachment over its own rows
    optimizer = getattr(rows, "optimizer", None)
    if optimizer is not None:
        return f"torch.optim.{type(optimizer).__name__}"
    treedef = getattr(getattr(rows, "plan", None), "_treedef", None)
    if treedef is None:
        return type(rows).__name__
    # Without object addresses (a function in a node's data), which differ between runs.
    return "optax state " + re.sub(r" at 0x[0-9a-fA-F]+", "", str(treedef))


def save_rows(rows: Any, path: Path, extra: dict[str, Any] | None = None) -> Path:
    """Writes the store behind `rows` (an attachment) with its optimizer state to `path`."""
    session = session_of(rows)
    # What TimeMachine.drop refuses (non-str keys, values JSON cannot hold), refused here
    # too before anything is written: a repr stored in their place would load as a string.
    check_extra(extra, numpy_scalars)
    # Held from the flush to the last byte written: a step of another thread (its fetch
    # waits) cannot change rows while they are written, or the CRCs would not match them.
    with session.owned():
        session.flush()
        return _write_rows(rows, session, path, extra)


def _write_rows(rows: Any, session: Any, path: Path, extra: dict[str, Any] | None) -> Path:
    store = rows.store
    table, state, counters = store.live()  # flushed by the caller, who holds the attachment
    tensors = _chunks("weight", table)
    for slot, values in state.items():
        tensors.update(_chunks(f"state.{slot}", values))
    if counters is not None:
        tensors.update(_chunks("counters", counters))
    manifest = {
        "format": FORMAT,
        "backend": backend_of(rows),
        "num_rows": store.num_rows,
        "dim": store.dim,
        "dtype": store.dtype,
        "chunk": CHUNK,
        "slots": sorted(state),
        "mode": session.mode,
        "step": session.t,
        "hyper": rows.hyper,
        "optimizer": optimizer_name(rows),
        "extra": extra or {},
    }
    # Hyper-parameters JSON cannot hold (a tensor lr, a schedule) are recorded by repr;
    # `extra` was checked whole, so repr never reaches it.
    check_header(tensors, manifest, repr, extra)
    write_anchor(path, tensors, manifest, default=repr)
    return path


def _is_count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def checked_manifest(
    anchor: Anchor,
    expected: str = FORMAT,
    legacy: tuple[str, ...] = LEGACY_FORMATS,
    older: tuple[str, ...] = OLDER_FORMATS,
) -> dict[str, Any]:
    """The manifest, each key of the type and range `save_rows` writes, in today's words.

    Of format `expected` (or a `legacy` or `older` one): an anchor's by default; a sharded
    set's manifest and its parts (``checkpoint.embedding_sets``) carry the same keys.
    """
    manifest = upgrade(anchor.manifest(expected, legacy, older))
    checks = {
        "num_rows": (lambda v: _is_count(v, 1), "a positive int"),
        "dim": (lambda v: _is_count(v, 1), "a positive int"),
        "chunk": (lambda v: _is_count(v, 1), "a positive int"),
        "step": (lambda v: _is_count(v, 0), "an int >= 0"),
        "mode": (lambda v: v in MODES, f"one of {MODES}"),
        "slots": (
            lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
            "a list of slot names",
        ),
        "extra": (lambda v: isinstance(v, dict), "an object"),
    }
    for key, (ok, expected) in checks.items():
        if key not in manifest:
            raise anchor.error(f"has a malformed manifest: no {key!r}")
        if not ok(manifest[key]):
            raise anchor.error(
                f"has a malformed manifest: {key!r} is {manifest[key]!r}, expected {expected}"
            )
    return manifest


def check_chunks(
    anchor: Anchor, manifest: dict[str, Any], targets: dict[str, np.ndarray]
) -> list[tuple[str, np.ndarray, int]]:
    """Every chunk of every table `load_rows` would write, checked against the file's header.

    Returns ``(tensor name, table, first row)`` for each chunk, in order.
    """
    num_rows, chunk = manifest["num_rows"], manifest["chunk"]
    expected = {"weight", *(f"state.{s}" for s in manifest["slots"])}
    if manifest["mode"] == "exact":
        expected.add("counters")
    stored: dict[str, set[str]] = {}
    for key in anchor.entries:
        stored.setdefault(key.rpartition(".")[0], set()).add(key)
    if set(stored) != expected:
        raise anchor.error(
            f"holds tables {sorted(stored)}; its manifest ({manifest['mode']} mode, slots "
            f"{manifest['slots']}) says {sorted(expected)}"
        )
    count = -(-num_rows // chunk)
    plan = []
    for name in sorted(expected):
        names = {f"{name}.{i}" for i in range(count)}
        if stored[name] != names:
            raise anchor.error(
                f"holds {len(stored[name])} chunks of {name!r}: {num_rows} rows in chunks of "
                f"{chunk} need {sorted(names)}"
            )
        table = targets.get(name)
        for i in range(count):
            key, start = f"{name}.{i}", i * chunk
            entry = anchor.entries[key]
            rows = min(chunk, num_rows - start)
            want = (rows, *(table.shape[1:] if table is not None else ()))
            if table is None:  # not loaded (a lazy store reading exact counters): shape only
                want = (rows,) if name == "counters" else (rows, manifest["dim"])
            if entry.shape != want:
                raise anchor.error(
                    f"has chunk {key!r} of shape {entry.shape}; rows {start}..{start + rows} "
                    f"of {name!r} need {want}"
                )
            if table is not None:
                if dtypes.kind(entry.dtype) != dtypes.kind(table.dtype):
                    raise anchor.error(
                        f"has chunk {key!r} of dtype {entry.dtype.name}; the store's {name!r} "
                        f"is {table.dtype.name}"
                    )
                plan.append((key, table, start))
    return plan


def check_fit(rows: Any, anchor: Anchor, manifest: dict[str, Any]) -> None:
    """Refuses an anchor whose optimizer state `rows`' optimizer cannot resume from.

    The same optimizer (when the same framework wrote it) and the same state slots; the
    table's shape is the caller's check.
    """
    store, path = rows.store, anchor.path
    recorded = manifest.get("optimizer")
    if recorded is not None:  # anchors of the older format do not say
        backend = backend_of(rows)
        if not isinstance(recorded, str):
            raise anchor.error(f"has a malformed manifest: 'optimizer' is {recorded!r}")
        if manifest.get("backend") == backend and recorded != optimizer_name(rows):
            raise CheckpointError(
                f"{path} holds the state of {recorded}; these rows are trained by "
                f"{optimizer_name(rows)} (resume with the optimizer that wrote it)"
            )
        if set(store.state) != set(manifest["slots"]):
            raise CheckpointError(
                f"{path} holds the state {manifest['slots']} of {recorded}; this optimizer "
                f"({optimizer_name(rows)}) keeps {sorted(store.state)}"
            )
    missing = sorted(set(store.state) - set(manifest["slots"]))
    if missing:
        raise CheckpointError(
            f"{path} has no state {missing} for this optimizer; it holds {manifest['slots']}"
        )


def load_rows(rows: Any, path: Path) -> dict[str, Any]:
    """Loads an anchor written by `save_rows` (under either framework) into `rows`' store.

    Every chunk is checked (names, count, row range, shape, dtype, CRC-32) before the first
    row is written: a bad file leaves the store as it was.

    Returns the manifest. Raises CheckpointError when the table's shape differs, the
    attachment's optimizer keeps a state table the anchor lacks, or the file is damaged.
    """
    session = session_of(rows)
    store = rows.store
    anchor = Anchor(path)
    manifest = checked_manifest(anchor)
    if (manifest["num_rows"], manifest["dim"]) != (store.num_rows, store.dim):
        raise CheckpointError(
            f"{path} holds a {manifest['num_rows']} x {manifest['dim']} table; this store is "
            f"{store.num_rows} x {store.dim}"
        )
    check_fit(rows, anchor, manifest)
    targets = {"weight": store.table, **{f"state.{k}": v for k, v in store.state.items()}}
    saved_counters = manifest["mode"] == "exact"
    if store.counters is not None and saved_counters:
        targets["counters"] = store.counters
    plan = check_chunks(anchor, manifest, targets)
    anchor.verify()  # every chunk's CRC-32, before the first row is written
    chunks = [(anchor.array(key), table, start) for key, table, start in plan]
    write_loaded(session, chunks, manifest)
    return manifest


def write_loaded(session: Any, chunks: list[tuple[Any, np.ndarray, int]], manifest: dict) -> None:
    """Copies checked chunks ``(values, table, first row)`` into a store and sets its step.

    Held while rows are written: no step of another thread lands in the middle, and the
    batch that thread has open (fetched before the load) is stepped or released first. A
    lazy run's rows count as current (their counters are set to the step).
    """
    store = session.store
    with session.owned():
        session.flush()
        # This thread's own open or prefetched batch holds rows from before the load.
        session.prefetched = session.current = None
        for values, table, start in chunks:
            table[start : start + len(values)] = values
        counters = store.live()[2]
        if counters is not None and manifest["mode"] != "exact":
            counters[...] = manifest["step"]
        session.t = manifest["step"]
