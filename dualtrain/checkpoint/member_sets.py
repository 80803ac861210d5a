"""TimeMachine's checkpoints of a BatchModule's members as sets: all written, or all loaded.

`MemberSets` holds `TimeMachine`'s `AnchorWriter` and `AnchorReader`: `drop` (the user's
`drop_members`) writes every member as its own anchor, all renamed into place or none;
`load` (`to_members`) loads a set into every member, or none. Each member's anchor is an
ordinary anchor of a single model, its payload the writer's and its load the reader's; the
helpers that know a BatchModule and commit a set (and ``member=`` of `drop` and `to`) are in
``member_anchors``, the names and numbers of a set in ``anchor_names``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dualtrain.checkpoint.anchor_file import numpy_scalars, stage_anchor
from dualtrain.checkpoint.anchor_names import (
    absent,
    check_unnumbered,
    inside,
    member_file,
    member_stem,
    newest_set,
    next_set_number,
)
from dualtrain.checkpoint.anchor_reader import AnchorReader
from dualtrain.checkpoint.anchor_writer import AnchorWriter
from dualtrain.checkpoint.fit import Restored
from dualtrain.checkpoint.member_anchors import (
    check_set_names,
    commit_set,
    craft_scope,
    discard_set,
    discard_stale_members,
    member_of,
    require_batch,
)
from dualtrain.errors import CheckpointError, bad_argument

__all__ = ["MemberSets"]


class MemberSets:
    """The member sets of `TimeMachine` (its `drop_members` and `to_members`, documented there).

    Args:
        writer: the TimeMachine's writer: each member's payload, names and retention.
        reader: the TimeMachine's reader: where a set is found, and each member's load.
    """

    def __init__(self, writer: AnchorWriter, reader: AnchorReader) -> None:
        self.writer = writer
        self.reader = reader

    def drop(self, bm: Any, file: str | os.PathLike, of: Callable[[Any], Any]) -> list[Path]:
        """`TimeMachine.drop_members`: every member of `bm` as its own anchor, all or none.

        `of(member)` is the payload of a member's anchor, checked: (tensors, manifest).
        """
        batch = require_batch(bm)
        first = member_of(bm, 0)
        payload = of(first)  # checks all
        scope = craft_scope(first)
        if absent(file):
            if self.writer.save_path is None:
                raise bad_argument(
                    "file", file, "the set's name, since the TimeMachine has no save_path"
                )
            n, finals = self._numbered_set(scope, batch)
        else:
            base = self.writer.target_file(file)
            check_unnumbered(base, file)
            finals = [member_file(base, i) for i in range(batch)]
        check_set_names(finals, file, named=not absent(file))
        staged: list[tuple[Path, Path]] = []
        try:
            for i in range(batch):
                if i:  # one member's copy at a time: memory stays one member's
                    payload = of(member_of(bm, i))
                tensors, manifest = payload
                staged.append(
                    (stage_anchor(finals[i], tensors, manifest, numpy_scalars), finals[i])
                )
            del payload
            if not absent(file):
                commit_set(staged, replace=True)
                discard_stale_members(finals[0], batch)  # an older, larger set's extra members
                return [p.absolute() for p in finals]
            for _ in range(1000):
                try:
                    commit_set(staged, replace=False)
                    break
                except FileExistsError:  # another writer took n: the next one, for all
                    n, finals = self._numbered_set(scope, batch, above=n)
                    staged = [(tmp, final) for (tmp, _), final in zip(staged, finals, strict=True)]
            else:  # pragma: no cover - a thousand writers racing for one scope
                raise CheckpointError(
                    f"no free set number for {scope!r} in {self.writer.save_path}"
                )
        except BaseException:
            discard_set(staged)
            raise
        for i in range(batch):
            self.writer.retain(member_stem(scope, i))
        return [p.absolute() for p in finals]

    def _numbered_set(self, scope: str, batch: int, above: int = 0) -> tuple[int, list[Path]]:
        """The next set number past the members' series and `above`, and the set's files.

        Past `above` too: a name taken by something numbering does not count (a folder)
        must not be tried again.
        """
        assert self.writer.save_path is not None
        n = max(next_set_number(self.writer.save_path, scope, batch), above + 1)
        stems = [member_stem(scope, i) for i in range(batch)]
        return n, [self.writer.save_path / f"{stem}-{n}.safetensors" for stem in stems]

    def load(self, bm: Any, file: Any, load: Callable[[Any, Path], Restored]) -> list[Restored]:
        """`TimeMachine.to_members`: a set of anchors into every member of `bm`, all or none.

        `load(member, path)` checks and loads one anchor into a copy of one member.
        """
        batch = require_batch(bm)
        first = member_of(bm, 0)
        paths = self._member_sources(craft_scope(first), file, batch)
        loaded = []
        for i, path in enumerate(paths):
            one = first if i == 0 else member_of(bm, i)
            loaded.append((one, load(one, path)))
        for i, (one, _) in enumerate(loaded):
            bm.insert(i, one)
        return [restored for _, restored in loaded]

    def _member_sources(
        self, scope: str, file: str | os.PathLike | Sequence[str | os.PathLike], batch: int
    ) -> list[Path]:
        """The anchors `to_members` reads, member 0 first."""
        if isinstance(file, Sequence) and not isinstance(file, (str, bytes)):
            if len(file) != batch:
                raise bad_argument(
                    "file", file, f"one anchor per member: a list of batch={batch} paths"
                )
            return [self.reader.source(scope, f) for f in file]
        if not absent(file):
            named = inside(None, file)  # checked here, found where `to` looks for it
            return [self.reader.source(scope, member_file(named, i)) for i in range(batch)]
        reader = self.reader
        folder = reader.ckpt_path if reader.ckpt_path is not None else reader.save_path
        if folder is None:
            raise bad_argument(
                "ckpt_path", None, "a folder of member anchors (or a save_path), or pass file="
            )
        if folder.is_file():
            raise bad_argument(
                "file",
                file,
                f"the set's name or its {batch} paths (ckpt_path {folder} is one anchor file)",
            )
        # Absolute: `to` takes a relative file as relative to the folder, so a relative
        # save_path's set would be looked for at folder/folder/...
        return newest_set(folder.absolute(), scope, batch)
