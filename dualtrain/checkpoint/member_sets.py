"""TimeMachine's checkpoints of a BatchModule's members: one (``member=``) or all, as sets.

`MemberSets` is a mixin of `TimeMachine`: `drop_members` writes every member as its own
anchor, all renamed into place or none; `to_members` loads a set into every member, or none;
`_member_argument` is the ``member=`` argument of `drop` and `to`. Each member's anchor is
an ordinary anchor of a single model, written and read by `TimeMachine`'s own `_payload` and
`to`; the helpers that know a BatchModule and commit a set are in ``member_anchors``, the
names and numbers of a set in ``anchor_names``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dualtrain.checkpoint.anchor_file import numpy_scalars, stage_anchor
from dualtrain.checkpoint.anchor_names import (
    _absent,
    _check_unnumbered,
    _inside,
    member_file,
    member_stem,
    newest_set,
    next_set_number,
)
from dualtrain.checkpoint.fit import Restored
from dualtrain.checkpoint.member_anchors import (
    batch_of,
    check_member,
    check_set_names,
    commit_set,
    craft_scope,
    discard_set,
    discard_stale_members,
    member_of,
)
from dualtrain.errors import CheckpointError, bad_argument

__all__ = ["MemberSets"]


class MemberSets:
    """The member methods of `TimeMachine` (documented there); a mixin, not used alone.

    They write and read each member through the `TimeMachine` methods declared below.
    """

    ckpt_path: Path | None
    save_path: Path | None

    if TYPE_CHECKING:  # provided by TimeMachine

        def _payload(
            self,
            craft: Any,
            save_scope: str | None,
            optimizer: Any,
            step: int | None,
            extra: dict[str, Any] | None,
            scheduler: Any,
        ) -> tuple[dict[str, Any], dict[str, Any]]: ...

        def _target_file(self, file: str | os.PathLike) -> Path: ...

        def _source(
            self, scope: str | None, file: str | os.PathLike, member: int | None = None
        ) -> Path: ...

        def _retain(self, stem: str) -> None: ...

        def to(
            self,
            craft: Any,
            file: str | os.PathLike = "",
            ckpt_scope: str | None = None,
            frozen: bool | None = None,
            optimizer: Any = None,
            restore_rng: bool = False,
            scheduler: Any = None,
            member: int | None = None,
        ) -> Restored: ...

    def drop_members(
        self,
        bm: Any,
        file: str | os.PathLike = "",
        save_scope: str | None = None,
        step: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> list[Path]:
        """Writes every member of a BatchModule as its own anchor: a set of `bm.batch` files.

        Member i's file holds exactly what ``drop(bm.extract(i))`` writes. Every member is
        written to a temporary file first and the set is renamed into place only when all
        are written, so a failure (a full disk at member 5 of 8) leaves no file of the set.

        Args:
            bm: a BatchModule (``dualtrain_torch``'s or ``dualtrain_jax``'s) over a realized
                Craft.
            file: the set's name, as for `drop`: member i is ``<file>%m<i>.safetensors``
                (an older set of that name is replaced). By default the set is numbered:
                ``<save_path>/<stem>%m<i>-<n>.safetensors`` with one n for every member,
                one past the highest of any member's series; `max_anchors` keeps that many
                anchors of each member's series.
            save_scope: as for `drop`.
            step: the training step, recorded in every member's anchor.
            extra: JSON-serializable data, recorded in every member's anchor.

        Returns:
            The members' anchors' absolute paths, member 0 first (`to_members` takes them).
        """
        batch = batch_of(bm)
        if batch is None:
            raise bad_argument(
                "bm", type(bm).__name__, "a BatchModule of dualtrain_torch or dualtrain_jax"
            )
        first = member_of(bm, 0)
        payload = self._payload(first, save_scope, None, step, extra, None)  # checks all
        scope = craft_scope(first)
        if _absent(file):
            if self.save_path is None:
                raise bad_argument(
                    "file", file, "the set's name, since the TimeMachine has no save_path"
                )
            n, finals = self._numbered_set(scope, batch)
        else:
            base = self._target_file(file)
            _check_unnumbered(base, file)
            finals = [member_file(base, i) for i in range(batch)]
        check_set_names(finals, file, named=not _absent(file))
        staged: list[tuple[Path, Path]] = []
        try:
            for i in range(batch):
                if i:  # one member's copy at a time: memory stays one member's
                    payload = self._payload(member_of(bm, i), save_scope, None, step, extra, None)
                tensors, manifest = payload
                staged.append(
                    (stage_anchor(finals[i], tensors, manifest, numpy_scalars), finals[i])
                )
            del payload
            if not _absent(file):
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
                raise CheckpointError(f"no free set number for {scope!r} in {self.save_path}")
        except BaseException:
            discard_set(staged)
            raise
        for i in range(batch):
            self._retain(member_stem(scope, i))
        return [p.absolute() for p in finals]

    def _numbered_set(self, scope: str, batch: int, above: int = 0) -> tuple[int, list[Path]]:
        """The next set number past the members' series and `above`, and the set's files.

        Past `above` too: a name taken by something numbering does not count (a folder)
        must not be tried again.
        """
        assert self.save_path is not None
        n = max(next_set_number(self.save_path, scope, batch), above + 1)
        stems = [member_stem(scope, i) for i in range(batch)]
        return n, [self.save_path / f"{stem}-{n}.safetensors" for stem in stems]

    def _member_argument(
        self, craft: Any, member: Any, every: str, optimizer: Any, scheduler: Any
    ) -> int | None:
        """Member `member` of `craft` (a BatchModule), or None for a single model.

        Refuses a member of a single model, a BatchModule without one, and an optimizer or
        scheduler with one (the stacked optimizer state holds every member).
        """
        batch = batch_of(craft)
        if batch is None:
            if member is not None:
                raise bad_argument(
                    "member",
                    member,
                    f"None for a single model (craft is a {type(craft).__name__}, not a "
                    "BatchModule)",
                )
            return None
        if member is None:
            raise bad_argument(
                "member",
                None,
                f"the index of one of the BatchModule's {batch} members, in [0, {batch}) "
                f"(or {every}(bm) for all of them)",
            )
        i = check_member(member, batch)
        for name, value in (("optimizer", optimizer), ("scheduler", scheduler)):
            if value is not None:
                raise bad_argument(
                    name,
                    type(value).__name__,
                    "None with member=: a member's optimizer and scheduler state are not "
                    "stored (the stacked state holds every member); save it with "
                    "bm.extract(i) and an optimizer of its own",
                )
        return i

    def to_members(
        self,
        bm: Any,
        file: str | os.PathLike | Sequence[str | os.PathLike] = "",
        ckpt_scope: str | None = None,
        frozen: bool = True,
    ) -> list[Restored]:
        """Loads a set of member anchors into every member of a BatchModule.

        Every anchor is checked, and loaded into a copy of its member, before any member
        changes: one that fails leaves the whole BatchModule as it was.

        Args:
            bm: a BatchModule (either framework's) over a realized Craft.
            file: the list of `bm.batch` anchors, member 0 first (what `drop_members`
                returned; any Craft anchors of the architecture, from either framework), or
                a set's name as given to `drop_members`. By default the newest set numbered
                by `drop_members` in `ckpt_path` (or `save_path`) that holds every member.
            ckpt_scope: load only names equal to it or under it.
            frozen: as for `to`; by default each member is filled whole, as `insert` does.

        Returns:
            One `Restored` per member.
        """
        batch = batch_of(bm)
        if batch is None:
            raise bad_argument(
                "bm", type(bm).__name__, "a BatchModule of dualtrain_torch or dualtrain_jax"
            )
        first = member_of(bm, 0)
        paths = self._member_sources(craft_scope(first), file, batch)
        loaded = []
        for i, path in enumerate(paths):
            one = first if i == 0 else member_of(bm, i)
            loaded.append((one, self.to(one, path, ckpt_scope, frozen)))
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
            return [self._source(scope, f) for f in file]
        if not _absent(file):
            named = _inside(None, file)  # checked here, found where `to` looks for it
            return [self._source(scope, member_file(named, i)) for i in range(batch)]
        folder = self.ckpt_path if self.ckpt_path is not None else self.save_path
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
