"""The members of a BatchModule as anchors: which objects are batched, members, sets.

A member's anchor is the anchor of ``bm.extract(i)``, an ordinary realized Craft, so it
loads as a single model under either framework (docs/batching.md, Checkpoints of members).
The core imports neither framework: a BatchModule, torch's or JAX's, is recognised by what
both offer (`batch`, `extract`, `insert`) and its members go through the adapters' usual
checkpoint part.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

from dualtrain import atomic
from dualtrain.checkpoint.vocabulary import BACKENDS
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.validate import check_int

__all__ = [
    "NAME_MAX",
    "batch_of",
    "check_member",
    "check_set_names",
    "commit_set",
    "craft_scope",
    "discard_set",
    "discard_stale_members",
    "member_index",
    "member_of",
    "require_batch",
]

NAME_MAX = 255  # bytes in a file name on common filesystems (ext4, xfs, APFS, NTFS)


def batch_of(obj: Any) -> int | None:
    """The member count of a BatchModule (either framework's), or None for anything else.

    A realized module (it names its ``dualtrain_backend``) is never a BatchModule.
    """
    if getattr(obj, "dualtrain_backend", None) is not None:
        return None
    batch = getattr(obj, "batch", None)
    if (
        callable(getattr(obj, "extract", None))
        and callable(getattr(obj, "insert", None))
        and isinstance(batch, int)
        and not isinstance(batch, bool)
        and batch >= 1
    ):
        return batch
    return None


def require_batch(bm: Any) -> int:
    """The member count of `bm`, refused (ArgumentError) unless a BatchModule."""
    batch = batch_of(bm)
    if batch is None:
        raise bad_argument(
            "bm", type(bm).__name__, "a BatchModule of dualtrain_torch or dualtrain_jax"
        )
    return batch


def craft_scope(craft: Any) -> str:
    """The scope a realized module's anchors are named for: its Craft's, else the class name."""
    return craft.craft.scope or type(craft.craft).__name__


def check_member(member: object, batch: int) -> int:
    """A member index in ``[-batch, batch)`` (as `extract` takes it), returned in ``[0, batch)``."""
    return check_int("member", member, minimum=-batch, maximum=batch - 1) % batch


def member_index(craft: Any, member: Any, every: str, optimizer: Any, scheduler: Any) -> int | None:
    """``member=`` of `drop` and `to`: member `member` of a BatchModule, or None for a model.

    Refuses a member of a single model, a BatchModule without one, and an optimizer or
    scheduler with one (the stacked optimizer state holds every member).
    """
    batch = batch_of(craft)
    if batch is None:
        if member is not None:
            raise bad_argument(
                "member",
                member,
                f"None for a single model (craft is a {type(craft).__name__}, not a BatchModule)",
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


def member_of(bm: Any, index: int) -> Any:
    """Member `index` of `bm` as a realized Craft module (``bm.extract(index)``, a copy).

    Raises:
        ArgumentError: the members are not realized Crafts (a plain torch module, a JAX
            ``(params, apply_fn)`` pair): their anchors would not load in the other
            framework, so they are saved with their framework's own tools.
    """
    member = bm.extract(index)
    if getattr(member, "dualtrain_backend", None) in BACKENDS:
        return member
    if isinstance(member, tuple):
        what, how = "(params, apply_fn) pairs", "save bm.extract(i)[0] with your own tools"
    else:
        what = f"plain {type(member).__name__} modules"
        how = "save bm.extract(i).state_dict() with torch.save or safetensors"
    raise ArgumentError(
        f"craft must be a BatchModule over a realized Craft (dualtrain_torch.realize or "
        f"dualtrain_jax.realize) for its members to become anchors; got a BatchModule of "
        f"{what}: {how}"
    )


def check_set_names(finals: list[Path], file: Any, named: bool) -> None:
    """Refuses, before anything is written, a set whose files could not all be renamed.

    A member's name too long for the filesystem, or (`named` set) a folder or other
    non-file where a member's file goes, would fail only at its rename, after the members
    before it. A numbered set steps past such a name instead.
    """
    for final in finals:
        if len(final.name.encode()) > NAME_MAX:
            raise ArgumentError(
                f"file must give member file names of at most {NAME_MAX} bytes; got "
                f"{final.name!r} ({len(final.name.encode())} bytes) for file={file!r}"
            )
        if named and os.path.lexists(final) and not final.is_file():
            raise ArgumentError(
                f"file must name member files where no folder is; got {final} (not a "
                f"regular file) for file={file!r}"
            )


def commit_set(staged: list[tuple[Path, Path]], replace: bool) -> None:
    """Renames each staged ``(temporary, final)`` file into place, in order.

    With ``replace=False`` (numbered anchors) no final file is replaced: if one exists (a
    writer racing for the number), the files already renamed go back to their temporary
    names and FileExistsError propagates, so the caller can take the next number. Any other
    failure also puts them back. With ``replace=True`` (a named set, which replaces an
    older set of that name) a rename that fails leaves the members before it renamed.
    """
    done: list[tuple[Path, Path]] = []
    try:
        for tmp, final in staged:
            atomic.commit(tmp, final, replace=replace)
            done.append((tmp, final))
    except BaseException:
        if not replace:
            for tmp, final in reversed(done):
                try:
                    os.replace(final, tmp)
                except OSError:  # never hide the error that stopped the renames
                    with contextlib.suppress(OSError):
                        final.unlink(missing_ok=True)
        raise


def discard_set(staged: list[tuple[Path, Path]]) -> None:
    """Removes the temporary files of a set that will not be renamed (never raises)."""
    for tmp, _ in staged:
        atomic.discard(tmp)


def discard_stale_members(first: Path, batch: int) -> None:
    """Removes the files of members ``batch, batch + 1, ...`` of a named set (never raises).

    `first` is member 0's file (``best%m0.safetensors``). A set of `batch` members replaces
    an older set of that name that had more: its extra members must go, or a later load of
    more members would mix the two sets.
    """
    tail = "%m0.safetensors"  # member_file's form: <name>%m<i>.safetensors
    if not first.name.endswith(tail):
        return
    prefix = first.name[: -len(tail)]
    form = re.compile(re.escape(prefix) + r"%m(0|[1-9][0-9]*)\.safetensors")
    with contextlib.suppress(OSError):
        for entry in os.scandir(first.parent):
            found = form.fullmatch(entry.name)
            if found and int(found.group(1)) >= batch and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
