"""Reading a Craft's anchors: which file `to` reads, and loading it all or not at all.

`AnchorReader` owns where `TimeMachine` looks for anchors (`ckpt_path`, else `save_path`).
`load` checks the whole file (structure, manifest, every CRC-32) and how it fits the model
(names, shapes, dtype kinds), and the optimizer's and scheduler's state, before it changes
anything; then it fills them, undoing what it filled if a later one fails.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dualtrain.checkpoint.anchor_file import Anchor
from dualtrain.checkpoint.anchor_names import SUFFIX, absent, inside, newest, with_suffix
from dualtrain.checkpoint.fit import Restored, check_rng, compare, few, select
from dualtrain.checkpoint.manifest import checked_manifest, is_plain, plain_manifest
from dualtrain.checkpoint.member_anchors import craft_scope
from dualtrain.checkpoint.optim_state import (
    check_optimizer,
    check_scheduler,
    optimizer_tensor_names,
    scheduler_tensor_names,
)
from dualtrain.checkpoint.seams import part_of
from dualtrain.errors import CheckpointError, bad_argument

__all__ = ["AnchorReader"]


class AnchorReader:
    """Finds and loads anchors: `file`, `ckpt_path` itself, or a scope's newest.

    Args:
        ckpt_path: an anchor file, or a folder where anchors are looked for.
        save_path: the folder looked in when there is no `ckpt_path`.
    """

    def __init__(self, ckpt_path: Path | None, save_path: Path | None) -> None:
        self.ckpt_path = ckpt_path
        self.save_path = save_path

    def source(self, scope: str | None, file: str | os.PathLike, member: int | None = None) -> Path:
        """The anchor `TimeMachine.to` reads: `file`, `ckpt_path` itself, or the scope's newest.

        `file` is relative to `ckpt_path` (its folder when it is a file), else `save_path`; left
        out, `ckpt_path` when it is a file, else the newest numbered anchor of `scope` there
        (`scope` None: an embedding anchor, which must be named), or of its member `member`.
        """
        ckpt_path, save_path = self.ckpt_path, self.save_path
        if not absent(file):
            path = self.named(file)
        elif ckpt_path is not None and ckpt_path.is_file():
            path = ckpt_path
        elif ckpt_path is not None and ckpt_path.name.endswith(SUFFIX) and not ckpt_path.exists():
            raise CheckpointError(f"ckpt_path {ckpt_path} does not exist (no such file)")
        else:
            folder = ckpt_path if ckpt_path is not None else save_path
            if folder is None:
                raise bad_argument(
                    "ckpt_path", None, "an anchor file or a folder of them (or a save_path)"
                )
            if scope is None:
                raise bad_argument(
                    "file", file, f"an embedding anchor's name (in {folder}), or a ckpt_path file"
                )
            path = newest(folder, scope, member)
        if not path.is_file():
            what = "is a folder, not an anchor file" if path.is_dir() else "does not exist"
            raise CheckpointError(f"no checkpoint at {path}: it {what}")
        return path

    def named(self, file: str | os.PathLike) -> Path:
        """The path `file` names (relative to `ckpt_path`'s folder, else `save_path`).

        With ``.safetensors`` appended unless only the name as given is a file; it may not
        exist (`source` checks).
        """
        ckpt_path, save_path = self.ckpt_path, self.save_path
        base = ckpt_path if ckpt_path is not None else save_path
        if base is not None and base.is_file():
            base = base.parent
        named = inside(base, file)
        path = with_suffix(named)
        if not path.is_file() and named.is_file():  # a file named without the suffix
            path = named
        return path

    def load(
        self,
        craft: Any,
        file: str | os.PathLike,
        ckpt_scope: str | None,
        frozen: bool | None,
        optimizer: Any,
        restore_rng: bool,
        scheduler: Any,
    ) -> Restored:
        """`TimeMachine.to` for a single realized model (arguments and result as there)."""
        part = part_of(craft)
        if ckpt_scope is not None and not isinstance(ckpt_scope, str):
            raise bad_argument("ckpt_scope", ckpt_scope, "a str or None")
        part.check_optimizer_argument(optimizer)
        path = self.source(craft_scope(craft), file)
        anchor = Anchor(path)
        plain = is_plain(anchor)
        if plain and (optimizer is not None or scheduler is not None):
            raise CheckpointError(
                f"{path} is a plain safetensors file (no dualtrain manifest): it holds no "
                f"{'optimizer' if optimizer is not None else 'scheduler'} state to load"
            )
        manifest = plain_manifest(anchor) if plain else checked_manifest(anchor)
        # A plain state_dict loads whole by default: every name, shape and dtype kind.
        frozen = bool(plain if frozen is None else frozen)
        specs = part.specs(craft)
        model = select(specs, ckpt_scope)
        stored = {k: (anchor.entries[k].shape, anchor.entries[k].dtype) for k in manifest["names"]}
        saved = select(stored, ckpt_scope)
        if ckpt_scope is not None and not saved:
            raise CheckpointError(
                f"ckpt_scope {ckpt_scope!r} matches no tensor of {path} ({few(stored)})"
            )
        if ckpt_scope is not None and not model:
            raise bad_argument(
                "ckpt_scope", ckpt_scope, f"a name or prefix of the module's ({few(specs)})"
            )
        try:
            skipped = compare(model, saved, frozen, path)
        except CheckpointError as err:
            if not plain:
                raise
            raise CheckpointError(
                f"{path} is a safetensors file but not a dualtrain checkpoint; read as a plain "
                f"state_dict (tensor names as torch's state_dict names them), it does not fit "
                f"the model: {err}"
            ) from err
        wanted = [k for k in saved if k in model and k not in skipped]
        extra_names, opt_names, sched_names = [], [], []
        if optimizer is not None:
            opt_names = optimizer_tensor_names(manifest, craft.dualtrain_backend, set(wanted), path)
        if scheduler is not None:
            sched_names = scheduler_tensor_names(manifest, path)
        extra_names = opt_names + sched_names
        if restore_rng and "__rng__" in anchor.entries:
            check_rng(part, anchor)
            extra_names.append("__rng__")
        anchor.verify()  # every tensor's CRC-32, loaded or not: a damaged file is refused whole
        tensors = part.native({k: anchor.array(k) for k in wanted + extra_names})
        restored = Restored(skipped)
        restored.file, restored.manifest = path, manifest
        restored.step, restored.extra = manifest.get("step"), manifest.get("extra", {})
        restored.optimizer = None
        # Optimizer and scheduler state are checked before anything changes (a refusal
        # leaves model and optimizer as they were); filling them cannot fail afterwards.
        fill_optimizer = fill_scheduler = None
        if optimizer is not None:
            fill_optimizer = check_optimizer(
                part,
                craft,
                optimizer,
                manifest,
                {k: tensors[k] for k in opt_names},
                set(wanted),
                path,
            )
        if scheduler is not None:
            fill_scheduler = check_scheduler(
                part, scheduler, manifest, {k: tensors[k] for k in sched_names}, path
            )
        # Each filler restores its own object if it fails; one that succeeded is undone when
        # a later one fails, so a refusal here too leaves everything as it was.
        undo: list[Any] = []
        try:
            if fill_optimizer is not None:
                restored.optimizer = fill_optimizer()
                undo.append(getattr(fill_optimizer, "undo", None))
            if fill_scheduler is not None:
                fill_scheduler()
                undo.append(getattr(fill_scheduler, "undo", None))
        except Exception as err:
            for step_back in reversed(undo):
                if step_back is not None:
                    step_back()
            if isinstance(err, CheckpointError):
                raise CheckpointError(f"{path}: {err}") from err
            raise CheckpointError(f"{path} holds state that does not load: {err!r}") from err
        part.import_tensors(craft, {k: tensors[k] for k in wanted})
        if restore_rng and "__rng__" in tensors:
            part.import_rng(tensors["__rng__"])
        return restored
