"""TimeMachine: checkpoints that move between torch and JAX.

A checkpoint ("anchor") is one safetensors file: parameters and state under their neutral
names in canonical layout, optimizer state in its framework's native form
(``checkpoint.optim_state``), and a JSON manifest in the file's header, with a CRC-32 of every
tensor and one of the header itself (``checkpoint.anchor_file``). It is written to a temporary
name and renamed (``dualtrain.atomic``), so a crash never leaves half an anchor; `to` checks
the whole file and how it fits the model before it changes anything. There is no pickle.
"""

from __future__ import annotations

import json
import numbers
import os
from pathlib import Path
from typing import Any

from dualtrain import backends
from dualtrain.checkpoint.anchor_file import (
    Anchor,
    check_extra,
    check_header,
    numpy_scalars,
    write_anchor,
)
from dualtrain.checkpoint.anchor_names import (
    _absent,
    _check_unnumbered,
    _inside,
    _keep_newest,
    _next_numbered,
    _with_suffix,
    anchor_stem,
    member_stem,
    source_path,
)
from dualtrain.checkpoint.embeddings import EmbeddingAnchors
from dualtrain.checkpoint.fit import BOOKKEEPING, Restored, _check_rng, _compare, _few, _select
from dualtrain.checkpoint.manifest import (  # FORMAT and the readers: re-exported here too
    FORMAT,
    LEGACY_FORMATS,
    OLDER_FORMATS,
    _checked,
    _manifest,
    craft_manifest,
    is_plain,
    plain_manifest,
)
from dualtrain.checkpoint.member_anchors import _NAME_MAX, craft_scope, member_of
from dualtrain.checkpoint.member_sets import MemberSets
from dualtrain.checkpoint.optim_state import (
    check_optimizer,
    check_scheduler,
    optimizer_tensor_names,
    record_optimizer,
    record_scheduler,
    scheduler_tensor_names,
)
from dualtrain.checkpoint.seams import CheckpointPart
from dualtrain.errors import ArgumentError, CheckpointError, bad_argument

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
_READERS = (_manifest,)  # tests and tools read an anchor's manifest as time_machine._manifest


class TimeMachine(MemberSets, EmbeddingAnchors):
    """Drops and loads checkpoints of realized Crafts, under either framework.

    Also the members of a BatchModule over a realized Craft, one (``member=``) or all
    (`drop_members`, `to_members`), each as an ordinary anchor of a single model.

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
        if not _integral(max_anchors) or max_anchors == 0 or max_anchors < -1:
            raise bad_argument("max_anchors", max_anchors, "a positive int, or -1 to keep all")
        max_anchors = int(max_anchors)
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
        i = self._member_argument(craft, member, "drop_members", optimizer, scheduler)
        if i is not None:
            craft = member_of(craft, i)
        tensors, manifest = self._payload(craft, save_scope, optimizer, step, extra, scheduler)
        # (A single model's target is asked with two arguments, as subclasses override it.)
        target = (
            (lambda: self._target(craft, file))
            if i is None
            else lambda: self._target(craft, file, i)
        )
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
        self._retain(stem)  # retention governs the anchors drop numbers itself, never a named file
        return path.absolute()

    def _payload(
        self,
        craft: Any,
        save_scope: str | None,
        optimizer: Any,
        step: int | None,
        extra: dict[str, Any] | None,
        scheduler: Any,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """What `drop` writes for `craft`: (the tensors, the manifest), all checked."""
        part = _adapter(craft)
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
        tensors = _select(everything, save_scope)
        if not tensors:
            raise bad_argument(
                "save_scope", save_scope, f"a name or prefix of the module's ({_few(everything)})"
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

    def _target(
        self, craft: Any, file: str | os.PathLike, member: int | None = None
    ) -> tuple[Path, str | None]:
        """Where `drop` writes, and the stem of a numbered anchor (None for a named file)."""
        if not _absent(file):
            path = self._target_file(file)
            _check_unnumbered(path, file)
            if len(os.fsencode(path.name)) > _NAME_MAX:  # else the disk's error, on a temp name
                raise ArgumentError(
                    f"file must give a file name of at most {_NAME_MAX} bytes; got "
                    f"{path.name!r} ({len(os.fsencode(path.name))} bytes) for file={file!r}"
                )
            return path, None
        if self.save_path is None:
            raise bad_argument("file", file, "a path, since the TimeMachine has no save_path")
        scope = craft_scope(craft)
        stem = anchor_stem(scope) if member is None else member_stem(scope, member)
        path = _next_numbered(self.save_path, stem)
        if len(os.fsencode(path.name)) > _NAME_MAX:
            raise ArgumentError(
                f"craft's scope {scope!r} gives numbered anchors names of "
                f"{len(os.fsencode(path.name))} bytes ({path.name!r}), over the {_NAME_MAX}-byte "
                f"limit on a file name: pass file= or give the Craft a shorter scope"
            )
        return path, stem

    def _retain(self, stem: str) -> None:
        if self.max_anchors == -1 or self.save_path is None:
            return
        _keep_newest(self.save_path, stem, self.max_anchors)

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
        i = self._member_argument(craft, member, "to_members", optimizer, scheduler)
        if i is not None:
            one = member_of(craft, i)  # a copy: loaded, then inserted only if it all loaded
            path = self._source(craft_scope(one), file, i)
            strict = True if frozen is None else frozen
            restored = self.to(one, path, ckpt_scope, strict, restore_rng=restore_rng)
            craft.insert(i, one)
            return restored
        part = _adapter(craft)
        if ckpt_scope is not None and not isinstance(ckpt_scope, str):
            raise bad_argument("ckpt_scope", ckpt_scope, "a str or None")
        part.check_optimizer_argument(optimizer)
        path = self._source(craft_scope(craft), file)
        anchor = Anchor(path)
        plain = is_plain(anchor)
        if plain and (optimizer is not None or scheduler is not None):
            raise CheckpointError(
                f"{path} is a plain safetensors file (no dualtrain manifest): it holds no "
                f"{'optimizer' if optimizer is not None else 'scheduler'} state to load"
            )
        manifest = plain_manifest(anchor) if plain else _checked(anchor)
        # A plain state_dict loads whole by default: every name, shape and dtype kind.
        frozen = bool(plain if frozen is None else frozen)
        specs = part.specs(craft)
        model = _select(specs, ckpt_scope)
        stored = {k: (anchor.entries[k].shape, anchor.entries[k].dtype) for k in manifest["names"]}
        saved = _select(stored, ckpt_scope)
        if ckpt_scope is not None and not saved:
            raise CheckpointError(
                f"ckpt_scope {ckpt_scope!r} matches no tensor of {path} ({_few(stored)})"
            )
        if ckpt_scope is not None and not model:
            raise bad_argument(
                "ckpt_scope", ckpt_scope, f"a name or prefix of the module's ({_few(specs)})"
            )
        try:
            skipped = _compare(model, saved, frozen, path)
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
            _check_rng(part, anchor)
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
                part, craft, scheduler, manifest, {k: tensors[k] for k in sched_names}, path
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

    def _target_file(self, file: str | os.PathLike) -> Path:
        return _with_suffix(_inside(self.save_path, file))

    def _source(
        self, scope: str | None, file: str | os.PathLike, member: int | None = None
    ) -> Path:
        """The anchor `to` reads: `file`, `ckpt_path` itself, or the scope's newest."""
        return source_path(self.ckpt_path, self.save_path, scope, file, member)


def _unwrapped(craft: Any) -> Any:
    """The model inside a Multiverse-synced one (its DDP's ``module``: unprefixed names)."""
    return getattr(craft, "dualtrain_wrapped", craft)


def _adapter(craft: Any) -> CheckpointPart:
    name = getattr(craft, "dualtrain_backend", None)
    if name not in ("torch", "jax"):
        raise bad_argument(
            "craft",
            type(craft).__name__,
            "a module from dualtrain_torch.realize or dualtrain_jax.realize",
        )
    return backends.load_part(name, "checkpoint")


def _integral(value: Any) -> bool:
    """An int, NumPy's included, and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
