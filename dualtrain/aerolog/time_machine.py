"""TimeMachine: checkpoints that move between torch and JAX.

A checkpoint ("anchor") is one safetensors file: parameters and state under their neutral
names in canonical layout, optimizer slots as ``optimizer.<slot>.<name>``, and a JSON
manifest in the file's header. It is written to a temporary name and renamed, so a crash
never leaves half an anchor. There is no pickle anywhere.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from dualtrain import backends
from dualtrain.aerolog.optim_state import OptimizerState
from dualtrain.errors import DualtrainError, bad_argument

__all__ = ["CheckpointError", "Restored", "TimeMachine"]

FORMAT = "dualtrain-checkpoint/1"
_SUFFIX = ".safetensors"


class CheckpointError(DualtrainError, ValueError):
    """A checkpoint does not fit the model, or is not a dualtrain checkpoint."""


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


class TimeMachine:
    """Drops and loads checkpoints of realized Crafts, under either framework.

    Args:
        ckpt_path: an anchor file, or a folder whose newest anchor `to` loads.
        save_path: the folder `drop` writes anchors to.
        max_anchors: how many anchors of a scope to keep in `save_path`, counted on disk
            (older ones are deleted); -1 keeps all.
    """

    def __init__(
        self,
        ckpt_path: str | os.PathLike | None = None,
        save_path: str | os.PathLike | None = None,
        max_anchors: int = -1,
    ) -> None:
        if not isinstance(max_anchors, int) or max_anchors == 0 or max_anchors < -1:
            raise bad_argument("max_anchors", max_anchors, "a positive int, or -1 to keep all")
        self.ckpt_path = Path(ckpt_path) if ckpt_path is not None else None
        self.save_path = Path(save_path) if save_path is not None else None
        self.max_anchors = max_anchors

    # ---- writing ---------------------------------------------------------------------

    def drop(
        self,
        craft: Any,
        file: str | os.PathLike = "",
        save_scope: str | None = None,
        optimizer: Any = None,
        step: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Writes an anchor of `craft`, a module from ``dualtrain_torch.realize`` or JAX's.

        Args:
            craft: the realized module.
            file: the anchor's path (relative to `save_path`); by default
                ``<save_path>/<scope>-<n>.safetensors`` with n one past the highest on disk.
            save_scope: save only names equal to it or under it (``"block"`` keeps
                ``block.0.weight``).
            optimizer: a ``torch.optim`` SGD/Adam/AdamW over the module's parameters, or an
                optax state from sgd/adam/adamw over ``module.params``.
            step: the training step, recorded.
            extra: JSON-serializable data to record (epoch, data position, ...).

        Returns:
            The anchor's path.
        """
        part = _adapter(craft)
        tensors = _select(part.export_tensors(craft), save_scope)
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "backend": craft.dualtrain_backend,
            "craft": type(craft.craft).__name__,
            "scope": craft.craft.scope,
            "dualtrain": _version(),
            "layout": "canonical",
            "step": step,
            "extra": extra or {},
            "names": {
                k: {"shape": list(v.shape), "dtype": v.dtype.name} for k, v in tensors.items()
            },
        }
        if optimizer is not None:
            state = part.export_optimizer(craft, optimizer)
            opt = _select_slots(state, save_scope)
            tensors.update(opt.tensors())
            manifest["optimizer"] = {"family": opt.family, "step": opt.step, "hyper": opt.hyper}
        rng = part.export_rng()
        if rng is not None:
            tensors["__rng__"] = rng
        manifest["tensors"] = sorted(tensors)
        path = self._target(craft, file)
        try:
            metadata = {"dualtrain": json.dumps(manifest, default=_jsonable)}
        except TypeError as err:
            raise bad_argument("extra", extra, "JSON-serializable data") from err
        _write_atomic(path, tensors, metadata)
        if not file:  # retention governs the anchors drop names itself, never a named file
            self._retain(path.stem.rpartition("-")[0])
        return path

    def _target(self, craft: Any, file: str | os.PathLike) -> Path:
        if file:
            return self._target_file(file)
        if self.save_path is None:
            raise bad_argument("file", file, "a path, since the TimeMachine has no save_path")
        stem = craft.craft.scope or type(craft.craft).__name__
        numbers = [n for n, _ in _anchors(self.save_path, stem)]
        return self.save_path / f"{stem}-{max(numbers, default=0) + 1}{_SUFFIX}"

    def _retain(self, stem: str) -> None:
        if self.max_anchors == -1 or self.save_path is None:
            return
        anchors = _anchors(self.save_path, stem)
        for _, path in anchors[: max(0, len(anchors) - self.max_anchors)]:
            path.unlink(missing_ok=True)

    # ---- reading ---------------------------------------------------------------------

    def to(
        self,
        craft: Any,
        file: str | os.PathLike = "",
        ckpt_scope: str | None = None,
        frozen: bool = False,
        optimizer: Any = None,
        restore_rng: bool = False,
    ) -> Restored:
        """Loads an anchor into `craft`, a realized torch or JAX module, whichever wrote it.

        Args:
            craft: the realized module; torch's is loaded in place, JAX's gets new arrays.
            file: the anchor; by default the newest in `ckpt_path`.
            ckpt_scope: load only names equal to it or under it.
            frozen: refuse any missing, unexpected or mis-shaped tensor (CheckpointError
                naming it); otherwise load what matches and report the rest.
            optimizer: a torch optimizer to fill in place, or an optax state to fill (the
                filled state is ``restored.optimizer``).
            restore_rng: also restore the framework's global RNG where it has one (torch).

        Returns:
            The names skipped (with why), and the step, extra data and optimizer restored.
        """
        path = self._source(file)
        manifest = _manifest(path)
        part = _adapter(craft)
        model = _select(part.shapes(craft), ckpt_scope)
        saved = _select({k: tuple(v["shape"]) for k, v in manifest["names"].items()}, ckpt_scope)
        skipped = _compare(model, saved, frozen, path)
        wanted = [k for k in saved if k in model and k not in skipped]
        info = manifest.get("optimizer")
        if optimizer is not None and info is None:
            raise CheckpointError(f"{path} holds no optimizer state; it was dropped without one")
        extra_names = []
        if optimizer is not None:
            extra_names = [k for k in manifest.get("tensors", []) if k.startswith("optimizer.")]
        if restore_rng and "__rng__" in manifest.get("tensors", []):
            extra_names.append("__rng__")
        # The adapter reads with its framework's safetensors binding (torch: memory-mapped).
        tensors = part.read(path, wanted + extra_names)
        part.import_tensors(craft, {k: tensors[k] for k in wanted})
        restored = Restored(skipped)
        restored.file, restored.manifest = path, manifest
        restored.step, restored.extra = manifest.get("step"), manifest.get("extra", {})
        restored.optimizer = None
        if optimizer is not None and info is not None:
            opt_tensors = {k: tensors[k] for k in extra_names if k.startswith("optimizer.")}
            state = OptimizerState.from_tensors(
                info["family"], info["step"], info["hyper"], opt_tensors
            )
            restored.optimizer = part.import_optimizer(craft, optimizer, state)
        if restore_rng and "__rng__" in tensors:
            part.import_rng(tensors["__rng__"])
        return restored

    def drop_embeddings(
        self, rows: Any, file: str | os.PathLike, extra: dict[str, Any] | None = None
    ) -> Path:
        """Writes an embedding store with its optimizer state (see ``aerolog.embeddings``).

        Args:
            rows: what ``dualtrain_torch.attach`` or ``dualtrain_jax.attach`` returned.
            file: the anchor's path (relative to `save_path`).
            extra: JSON-serializable data to record.
        """
        from dualtrain.aerolog.embeddings import save_rows

        return save_rows(rows, self._target_file(file), extra)

    def to_embeddings(self, rows: Any, file: str | os.PathLike = "") -> dict[str, Any]:
        """Loads an embedding anchor, written under either framework, into `rows`' store.

        Returns:
            The anchor's manifest (step, mode, hyper-parameters, extra).
        """
        from dualtrain.aerolog.embeddings import load_rows

        return load_rows(rows, self._source(file))

    def _target_file(self, file: str | os.PathLike) -> Path:
        path = Path(file)
        if not path.is_absolute() and self.save_path is not None:
            path = self.save_path / path
        return path if path.suffix else path.with_suffix(_SUFFIX)

    def _source(self, file: str | os.PathLike) -> Path:
        if file:
            path = Path(file)
            if not path.is_absolute() and self.ckpt_path is not None and self.ckpt_path.is_dir():
                path = self.ckpt_path / path
        elif self.ckpt_path is not None and self.ckpt_path.is_file():
            path = self.ckpt_path
        elif self.ckpt_path is not None and self.ckpt_path.is_dir():
            found = sorted(self.ckpt_path.glob(f"*{_SUFFIX}"), key=_anchor_order)
            if not found:
                raise CheckpointError(f"no {_SUFFIX} anchors in {self.ckpt_path}")
            path = found[-1]
        else:
            raise bad_argument("ckpt_path", self.ckpt_path, "an anchor file or a folder of them")
        if not path.is_file():
            raise CheckpointError(f"no checkpoint at {path}")
        return path


def _adapter(craft: Any) -> Any:
    name = getattr(craft, "dualtrain_backend", None)
    if name not in ("torch", "jax"):
        raise bad_argument(
            "craft",
            type(craft).__name__,
            "a module from dualtrain_torch.realize or dualtrain_jax.realize",
        )
    return backends.load_part(name, "checkpoint")


def _in_scope(name: str, scope: str | None) -> bool:
    return scope is None or name == scope or name.startswith(scope + ".")


def _select(tensors: dict[str, Any], scope: str | None) -> dict[str, Any]:
    return {k: v for k, v in tensors.items() if _in_scope(k, scope)}


def _select_slots(state: OptimizerState, scope: str | None) -> OptimizerState:
    slots = {slot: _select(values, scope) for slot, values in state.slots.items()}
    return OptimizerState(state.family, state.step, slots, state.hyper)


def _compare(
    model: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]], frozen: bool, path: Path
) -> list[str]:
    """Names to skip; with `frozen`, a CheckpointError naming the first problem of each kind."""
    problems, skipped = [], []
    for name, shape in model.items():
        if name not in saved:
            problems.append(f"{name} is in the model but not in {path.name}")
            skipped.append(name)
        elif tuple(saved[name]) != tuple(shape):
            problems.append(
                f"{name} is {tuple(saved[name])} on disk but {tuple(shape)} in the model"
            )
            skipped.append(name)
    for name in saved:
        if name not in model:
            problems.append(f"{name} is in {path.name} but not in the model")
            skipped.append(name)
    if frozen and problems:
        raise CheckpointError("frozen load refused: " + "; ".join(problems))
    return skipped


def _manifest(path: Path, expected: str = FORMAT) -> dict[str, Any]:
    """The manifest in an anchor's header, read without loading any tensor.

    `expected` is the format the caller reads (Craft anchors or embedding anchors).
    """
    try:
        with safetensors.safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
    except Exception as err:  # safetensors raises its own error types for foreign files
        raise CheckpointError(f"{path} is not a safetensors file: {err}") from err
    if "dualtrain" not in metadata:
        raise CheckpointError(f"{path} is a safetensors file but not a dualtrain checkpoint")
    manifest = json.loads(metadata["dualtrain"])
    if manifest.get("format") != expected:
        raise CheckpointError(
            f"{path} has format {manifest.get('format')!r}; this reads {expected!r}"
        )
    return dict(manifest)


def _write_atomic(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        # Adapters hand over contiguous host arrays (views of their tensors): no copy here.
        safetensors.numpy.save_file(
            {k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp, metadata=metadata
        )
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _anchors(folder: Path, stem: str) -> list[tuple[int, Path]]:
    pattern = re.compile(rf"{re.escape(stem)}-(\d+){re.escape(_SUFFIX)}$")
    found = []
    for path in folder.glob(f"{stem}-*{_SUFFIX}") if folder.is_dir() else []:
        match = pattern.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _anchor_order(path: Path) -> tuple[float, int]:
    match = re.search(r"-(\d+)\.safetensors$", path.name)
    return (path.stat().st_mtime, int(match.group(1)) if match else -1)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def _version() -> str:
    from dualtrain import __version__

    return __version__
