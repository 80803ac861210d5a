"""Writing a Craft's anchors: what `drop` writes, where, and how many numbered ones stay.

`AnchorWriter` owns the folder anchors are written to (`save_path`) and their retention
(`max_anchors`); `TimeMachine` and `MemberSets` hold one and ask it for an anchor's payload
(tensors and manifest, checked before anything is written), its file (a named one, or the
next number of its scope's series) and the retention of a series.
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dualtrain.checkpoint.anchor_file import check_extra, check_header, numpy_scalars, write_anchor
from dualtrain.checkpoint.anchor_names import (
    absent,
    anchor_stem,
    check_unnumbered,
    inside,
    keep_newest,
    member_stem,
    next_numbered,
    with_suffix,
)
from dualtrain.checkpoint.fit import few, select
from dualtrain.checkpoint.manifest import craft_manifest
from dualtrain.checkpoint.member_anchors import NAME_MAX, craft_scope
from dualtrain.checkpoint.optim_state import record_optimizer, record_scheduler
from dualtrain.checkpoint.seams import part_of
from dualtrain.errors import ArgumentError, CheckpointError, bad_argument

__all__ = ["AnchorWriter", "check_max_anchors"]


def check_max_anchors(value: Any) -> int:
    """`max_anchors` as an int: positive, or -1 to keep all (ArgumentError otherwise)."""
    if not _integral(value) or value == 0 or value < -1:
        raise bad_argument("max_anchors", value, "a positive int, or -1 to keep all")
    return int(value)


class AnchorWriter:
    """Writes anchors into `save_path`, keeping the newest `max_anchors` of each series.

    Args:
        save_path: the folder numbered anchors (and relative names) go to, or None.
        max_anchors: how many numbered anchors of a series to keep, counted on disk (older
            ones are deleted); -1 keeps all.
    """

    def __init__(self, save_path: Path | None, max_anchors: int) -> None:
        self.save_path = save_path
        self.max_anchors = max_anchors

    def write(
        self,
        tensors: dict[str, Any],
        manifest: dict[str, Any],
        target: Callable[[], tuple[Path, str | None]],
    ) -> Path:
        """Writes a payload to `target()` (`target`'s answer) and returns its absolute path.

        A named file replaces what is there; a numbered one never replaces a file: `target`
        is asked again for the next number, and the series is then trimmed (`retain`).
        """
        path, stem = target()
        if stem is None:
            write_anchor(path, tensors, manifest, default=numpy_scalars)
            return path.absolute()
        # A numbered anchor never replaces a file: another process numbering the same scope
        # in this folder may have taken n meanwhile, so the next free number is taken.
        for _ in range(1000):
            try:
                write_anchor(path, tensors, manifest, default=numpy_scalars, replace=False)
                break
            except FileExistsError:
                path, _ = target()  # the same stem, the next number
        else:  # pragma: no cover - a thousand writers racing for one scope
            raise CheckpointError(f"no free anchor number for {stem} in {self.save_path}")
        self.retain(stem)  # retention governs the anchors drop numbers itself, never a named file
        return path.absolute()

    def payload(
        self,
        craft: Any,
        save_scope: str | None,
        optimizer: Any,
        step: int | None,
        extra: dict[str, Any] | None,
        scheduler: Any,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """What `drop` writes for `craft`: (the tensors, the manifest), all checked."""
        part = part_of(craft)
        if save_scope is not None and not isinstance(save_scope, str):
            raise bad_argument("save_scope", save_scope, "a str or None")
        if step is not None and not _integral(step):
            raise bad_argument("step", step, "an int or None")
        if step is not None:
            try:  # Python's json writes (and reads) ints up to its digit limit only
                json.dumps(int(step))
            except ValueError as err:  # (its repr fails the same way: described by size)
                raise ArgumentError(
                    f"step must be an int JSON can hold; got one of {int(step).bit_length():,} "
                    f"bits ({err})"
                ) from err
        check_extra(extra, numpy_scalars)  # refused before anything is computed or written
        everything = part.export_tensors(craft)
        tensors = select(everything, save_scope)
        if not tensors:
            raise bad_argument(
                "save_scope", save_scope, f"a name or prefix of the module's ({few(everything)})"
            )
        manifest = craft_manifest(craft, tensors, step, extra)
        if optimizer is not None:  # refused here, by name, if it cannot be stored
            opt_tensors, manifest["optimizer"] = record_optimizer(
                part, craft, optimizer, save_scope
            )
            tensors.update(opt_tensors)
        if scheduler is not None:
            sched_tensors, manifest["scheduler"] = record_scheduler(part, craft, scheduler)
            tensors.update(sched_tensors)
        rng = part.export_rng()
        if rng is not None:
            tensors["__rng__"] = rng
        manifest["tensors"] = sorted(tensors)
        # What `to` would refuse is refused here, before anything is written: the header
        # (manifest, extra and tensor table) over safetensors' limit.
        check_header(tensors, manifest, numpy_scalars, extra)
        return tensors, manifest

    def target(
        self, craft: Any, file: str | os.PathLike, member: int | None = None
    ) -> tuple[Path, str | None]:
        """Where `drop` writes, and the stem of a numbered anchor (None for a named file)."""
        if not absent(file):
            path = self.target_file(file)
            check_unnumbered(path, file)
            if len(os.fsencode(path.name)) > NAME_MAX:  # else the disk's error, on a temp name
                raise ArgumentError(
                    f"file must give a file name of at most {NAME_MAX} bytes; got "
                    f"{path.name!r} ({len(os.fsencode(path.name))} bytes) for file={file!r}"
                )
            return path, None
        if self.save_path is None:
            raise bad_argument("file", file, "a path, since the TimeMachine has no save_path")
        scope = craft_scope(craft)
        stem = anchor_stem(scope) if member is None else member_stem(scope, member)
        path = next_numbered(self.save_path, stem)
        if len(os.fsencode(path.name)) > NAME_MAX:
            raise ArgumentError(
                f"craft's scope {scope!r} gives numbered anchors names of "
                f"{len(os.fsencode(path.name))} bytes ({path.name!r}), over the {NAME_MAX}-byte "
                f"limit on a file name: pass file= or give the Craft a shorter scope"
            )
        return path, stem

    def target_file(self, file: str | os.PathLike) -> Path:
        """The file a name the user gives stands for: inside `save_path`, with the suffix."""
        return with_suffix(inside(self.save_path, file))

    def retain(self, stem: str) -> None:
        """Deletes all but the newest `max_anchors` numbered anchors of `stem`'s series."""
        if self.max_anchors == -1 or self.save_path is None:
            return
        keep_newest(self.save_path, stem, self.max_anchors)


def _integral(value: Any) -> bool:
    """An int, NumPy's included, and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
