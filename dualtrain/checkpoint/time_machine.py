"""TimeMachine: checkpoints that move between torch and JAX.

A checkpoint ("anchor") is one safetensors file: parameters and state under their neutral
names in canonical layout, optimizer state in its framework's native form
(``checkpoint.optim_state``), and a JSON manifest in the file's header, with a CRC-32 of every
tensor and one of the header itself (``checkpoint.anchor_file``). It is written to a temporary
name and renamed (``dualtrain.atomic``), so a crash never leaves half an anchor; `to` checks
the whole file and how it fits the model before it changes anything. There is no pickle.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dualtrain.checkpoint.anchor_names import absent, anchor_stem
from dualtrain.checkpoint.anchor_reader import AnchorReader
from dualtrain.checkpoint.anchor_writer import AnchorWriter, check_max_anchors
from dualtrain.checkpoint.embedding_sets import drop_parts, load_any, save_set, unfinished
from dualtrain.checkpoint.embeddings import save_rows
from dualtrain.checkpoint.fit import BOOKKEEPING, Restored
from dualtrain.checkpoint.manifest import FORMAT, LEGACY_FORMATS, OLDER_FORMATS  # re-exported
from dualtrain.checkpoint.member_anchors import craft_scope, member_index, member_of
from dualtrain.checkpoint.member_sets import MemberSets
from dualtrain.errors import CheckpointError, bad_argument

__all__ = [
    "BOOKKEEPING",
    "FORMAT",
    "LEGACY_FORMATS",
    "OLDER_FORMATS",
    "CheckpointError",
    "Restored",
    "TimeMachine",
    "anchor_stem",
]


class TimeMachine:
    """Drops and loads checkpoints of realized Crafts, under either framework.

    Also the members of a BatchModule over a realized Craft, one (``member=``) or all
    (`drop_members`, `to_members`), each as an ordinary anchor of a single model.

    It holds an `AnchorWriter` (``checkpoint.anchor_writer``: `save_path`, `max_anchors`),
    an `AnchorReader` (``checkpoint.anchor_reader``: `ckpt_path`) and the `MemberSets` over
    both (``checkpoint.member_sets``); embedding stores go through ``checkpoint.embeddings``.

    Args:
        ckpt_path: an anchor file, or a folder where `to` looks for anchors (by default
            `save_path`).
        save_path: the folder `drop` writes anchors to.
        max_anchors: how many numbered anchors of a scope to keep in `save_path`, counted
            on disk (older ones are deleted); -1 keeps all.
    """

    def __init__(
        self,
        ckpt_path: str | os.PathLike | None = None,
        save_path: str | os.PathLike | None = None,
        max_anchors: int = -1,
    ) -> None:
        max_anchors = check_max_anchors(max_anchors)
        ckpt = Path(ckpt_path) if ckpt_path is not None else None
        save = Path(save_path) if save_path is not None else None
        self.writer = AnchorWriter(save, max_anchors)
        self.reader = AnchorReader(ckpt, save)
        self.members = MemberSets(self.writer, self.reader)

    def __copy__(self) -> TimeMachine:
        """A TimeMachine with these settings, whose paths and limit change on their own.

        (Its writer and reader are its own: a shallow copy of the attributes would share
        them, and so the paths set on one copy.)
        """
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.writer, new.reader = copy.copy(self.writer), copy.copy(self.reader)
        new.members = MemberSets(new.writer, new.reader)
        return new

    @property
    def ckpt_path(self) -> Path | None:
        """Where `to` looks for anchors: a file, or a folder (None: `save_path`)."""
        return self.reader.ckpt_path

    @ckpt_path.setter
    def ckpt_path(self, value: Path | None) -> None:
        self.reader.ckpt_path = value

    @property
    def save_path(self) -> Path | None:
        """The folder `drop` writes anchors to (and `to` reads without a `ckpt_path`)."""
        return self.writer.save_path

    @save_path.setter
    def save_path(self, value: Path | None) -> None:
        self.writer.save_path = self.reader.save_path = value

    @property
    def max_anchors(self) -> int:
        """How many numbered anchors of a scope `drop` keeps in `save_path` (-1: all)."""
        return self.writer.max_anchors

    @max_anchors.setter
    def max_anchors(self, value: int) -> None:
        self.writer.max_anchors = value

    # ---- writing ---------------------------------------------------------------------

    def drop(
        self,
        craft: Any,
        file: str | os.PathLike = "",
        save_scope: str | None = None,
        optimizer: Any = None,
        step: int | None = None,
        extra: dict[str, Any] | None = None,
        scheduler: Any = None,
        member: int | None = None,
    ) -> Path:
        """Writes an anchor of `craft`, a module from ``dualtrain_torch.realize`` or JAX's.

        Args:
            craft: the realized module, or a BatchModule (either framework's, over a realized
                Craft) with `member`.
            file: the anchor's name or path, relative to `save_path` and staying inside it
                (``"best"``, ``"runs/best"``), or absolute; ``.safetensors`` is appended
                unless the name ends with it. By default ``<save_path>/<stem>-<n>.safetensors``
                with the stem from the Craft's scope (`anchor_stem`) and n one past the
                highest on disk; a member's own series is ``<stem>%m<i>-<n>.safetensors``.
            save_scope: save only names equal to it or under it (``"block"`` keeps
                ``block.0.weight``).
            optimizer: any ``torch.optim`` optimizer over the module's parameters, or any
                optax state over ``module.params``; one whose state has no tensor-or-JSON
                form is refused, naming it, before anything is written. Not with `member`.
            step: the training step, recorded (an int; NumPy's too).
            extra: JSON data to record (epoch, a Tank's ``state_dict()``, ...): a dict with
                str keys at every depth, whose header fits safetensors' 100,000,000 bytes;
                anything `to` would refuse or read back otherwise is refused here, naming
                it, before anything is written (tuples load back as lists).
            scheduler: a ``torch.optim.lr_scheduler`` scheduler (torch only: optax keeps
                schedules inside its state). Not with `member`.
            member: with a BatchModule, the member to drop (``-1`` is the last): the file
                holds exactly what ``drop(craft.extract(member))`` writes, an ordinary
                anchor that loads as a single model under either framework.

        Returns:
            The anchor's absolute path (`to` takes it as it is).
        """
        craft = _unwrapped(craft)
        i = member_index(craft, member, "drop_members", optimizer, scheduler)
        if i is not None:
            craft = member_of(craft, i)
        tensors, manifest = self._payload(craft, save_scope, optimizer, step, extra, scheduler)
        # (A single model's target is asked with two arguments, as subclasses override it.)
        target = (
            (lambda: self._target(craft, file))
            if i is None
            else lambda: self._target(craft, file, i)
        )
        return self.writer.write(tensors, manifest, target)

    def _payload(self, craft: Any, *args: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """What `drop` writes for `craft`: (the tensors, the manifest), all checked.

        The writer's `payload`, with its arguments; `drop` and `drop_members` ask here.
        """
        return self.writer.payload(craft, *args)

    def _target(
        self, craft: Any, file: str | os.PathLike, member: int | None = None
    ) -> tuple[Path, str | None]:
        """Where `drop` writes, and the stem of a numbered anchor (None for a named file).

        Asked again for each number `drop` tries, so a subclass may override it.
        """
        return self.writer.target(craft, file, member)

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
        return self.members.drop(
            bm, file, lambda one: self._payload(one, save_scope, None, step, extra, None)
        )

    def drop_embeddings(
        self, rows: Any, file: str | os.PathLike, extra: dict[str, Any] | None = None
    ) -> Path:
        """Writes an embedding store with its optimizer state (see ``checkpoint.embeddings``).

        A store sharded by ``mv.sync(store)`` is written by every process at once (call it
        on every rank, directly or through ``mv.time_machine(tm)``): each rank writes its
        rows as a part file beside `file`, and rank 0 writes `file` last, the manifest that
        names the parts and commits the set (``checkpoint.embedding_sets``). An error on any
        rank is raised on every rank.

        Args:
            rows: what ``dualtrain_torch.attach`` or ``dualtrain_jax.attach`` returned.
            file: the anchor's name or path, as for `drop`.
            extra: JSON-serializable data to record.

        Returns:
            The anchor's absolute path (a sharded store's: the set's manifest).
        """
        if absent(file):
            raise bad_argument("file", file, "the embedding anchor's name or path")
        path, _ = self._target(None, file)
        if getattr(getattr(rows, "store", None), "shard", None) is not None:
            return save_set(rows, path, extra).absolute()
        save_rows(rows, path, extra)
        drop_parts(path)  # of a set this file replaced: no manifest names them any more
        return path.absolute()

    # ---- reading ---------------------------------------------------------------------

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
    ) -> Restored:
        """Loads an anchor into `craft`, a realized torch or JAX module, whichever wrote it.

        The whole file is checked first (structure, manifest, every CRC-32 read) and so is how
        it fits the model (names, shapes, dtypes); a file that fails leaves the model and the
        optimizer exactly as they were.

        Args:
            craft: the realized module; torch's is loaded in place, JAX's gets new arrays. Or
                a BatchModule (either framework's, over a realized Craft) with `member`.
            file: the anchor, named as for `drop` (relative to `ckpt_path`, or `save_path`
                when there is no `ckpt_path`), or the path `drop` returned. By default the
                highest-numbered anchor of the Craft's scope in that folder (of the member's
                series with `member`), or `ckpt_path` itself if it is a file. A plain
                safetensors file without a dualtrain manifest (``safetensors.torch.save_file(
                module.state_dict(), path)``) loads as a state_dict: its tensor names are the
                model's torch ``state_dict`` names, in torch's layout (docs/checkpoints.md).
            ckpt_scope: load only names equal to it or under it.
            frozen: refuse any missing, unexpected or mis-shaped tensor, or one of another
                dtype kind (CheckpointError naming each); otherwise load what matches and
                report the rest. Never broadcast: ``(1,)`` does not load into ``(16,)``.
                By default False for a model and True for a member (whole, as `insert`) and
                for a plain safetensors file.
            optimizer: a torch optimizer to fill in place, or an optax state to fill (the
                filled state is ``restored.optimizer``). Same framework as the writer: the
                native state (same class, or same optax structure); the other framework: the
                neutral families only (docs/checkpoints.md, Optimizers). Slots of skipped
                parameters are not loaded.
            restore_rng: also restore the framework's global RNG where it has one (torch).
            scheduler: a torch LR scheduler to load in place (the anchor must hold one).
            member: with a BatchModule, the member to fill (``-1`` is the last) from any
                Craft anchor of its architecture, written by either framework (a single
                model's or a member's). Checked as for a single model before the member
                changes; not with `optimizer` or `scheduler`.

        Returns:
            The names skipped (with why), and the step, extra data and optimizer restored.
        """
        craft = _unwrapped(craft)
        i = member_index(craft, member, "to_members", optimizer, scheduler)
        if i is None:
            return self.reader.load(
                craft, file, ckpt_scope, frozen, optimizer, restore_rng, scheduler
            )
        one = member_of(craft, i)  # a copy: loaded, then inserted only if it all loaded
        path = self.reader.source(craft_scope(one), file, i)
        strict = True if frozen is None else frozen
        restored = self.reader.load(one, path, ckpt_scope, strict, None, restore_rng, None)
        craft.insert(i, one)
        return restored

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
        return self.members.load(
            bm,
            file,
            lambda one, path: self.reader.load(one, path, ckpt_scope, frozen, None, False, None),
        )

    def to_embeddings(self, rows: Any, file: str | os.PathLike = "") -> dict[str, Any]:
        """Loads an embedding anchor, written under either framework, into `rows`' store.

        Any anchor loads into a store of any world size: a single file or a sharded store's
        set (written by any number of processes), into an unsharded store or a shard, whose
        rank then reads only the parts and chunks that hold its rows. A shard's load is a
        collective (every rank calls it): every rank checks what it reads first, and the
        rows change on every rank or on none.

        Args:
            rows: what ``dualtrain_torch.attach`` or ``dualtrain_jax.attach`` returned.
            file: the anchor, named as for `to`; may be left out when `ckpt_path` is the file.

        Returns:
            The anchor's manifest (step, mode, hyper-parameters, extra).
        """
        try:
            path = self.reader.source(None, file)
        except CheckpointError as err:
            cut_short = None if absent(file) else unfinished(self.reader.named(file))
            if cut_short is not None:
                raise cut_short from err
            raise
        return load_any(rows, path)


def _unwrapped(craft: Any) -> Any:
    """The model inside a Multiverse-synced one (its DDP's ``module``: unprefixed names)."""
    return getattr(craft, "dualtrain_wrapped", craft)
