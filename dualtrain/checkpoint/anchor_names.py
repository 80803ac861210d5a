"""Anchor names: where numbered anchors live and which one is the newest.

The file-name stem of a scope's numbered anchors (``<stem>-<n>.safetensors``), the checks on
the names `TimeMachine` is given (relative names stay inside their folder; a name the user
gives may not take the numbered form), numbering, finding a scope's numbered anchors on disk
(the newest last), and retention of the newest few.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from dualtrain.errors import CheckpointError, bad_argument

__all__ = [
    "SUFFIX",
    "absent",
    "anchor_stem",
    "check_unnumbered",
    "inside",
    "keep_newest",
    "member_file",
    "member_stem",
    "newest",
    "newest_set",
    "next_numbered",
    "next_set_number",
    "with_suffix",
]

SUFFIX = ".safetensors"
# A numbered anchor's name: its number is ASCII digits without a leading zero. Only `drop`
# writes names of this form (a name the user gives may not have it), so numbering and
# retention only ever see the anchors `drop` numbered.
_NUMBERED = re.compile(r"(?P<stem>.+)-(?P<n>[1-9][0-9]*)" + re.escape(SUFFIX))
_NUMBERED_FORM = re.compile(r".+-[0-9]+" + re.escape(SUFFIX))


def anchor_stem(scope: str) -> str:
    r"""The file-name stem of a scope's numbered anchors (``<stem>-<n>.safetensors``).

    The scope as it is, except that ``%``, ``/``, ``\``, control characters and a leading
    ``.`` are written ``%XX`` (their UTF-8 bytes in hex), so every scope gets its own
    stem, in the folder itself: ``exp/run`` -> ``exp%2Frun``; ``net[1]`` stays ``net[1]``.
    """
    out = []
    for i, ch in enumerate(scope):
        if ch in "%/\\" or ord(ch) < 0x20 or ord(ch) == 0x7F or (i == 0 and ch == "."):
            out.append("".join(f"%{b:02X}" for b in ch.encode()))
        else:
            out.append(ch)
    return "".join(out)


# What a member's anchors add to a name: ``%m<i>``. `anchor_stem` writes every ``%`` of a
# scope as ``%XX`` (two hex digits), so no scope's stem holds ``%m``: member series never
# meet a scope's own anchors (nor another scope's members) in numbering or retention.
_MEMBER_MARK = "%m"
_MEMBER_FORM = re.compile(r".*%m(0|[1-9][0-9]*)\.safetensors")


def member_stem(scope: str, member: int) -> str:
    """The stem of the numbered anchors of member `member` of a BatchModule of `scope`.

    ``anchor_stem(scope) + "%m<member>"``: ``MLP`` member 3 numbers ``MLP%m3-<n>.safetensors``.
    """
    return f"{anchor_stem(scope)}{_MEMBER_MARK}{member}"


def member_file(path: Path, member: int) -> Path:
    """Member `member`'s file of a named set: ``best.safetensors`` -> ``best%m3.safetensors``."""
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    return path.with_name(f"{stem}{_MEMBER_MARK}{member}{SUFFIX}")


def next_set_number(folder: Path, scope: str, batch: int) -> int:
    """One past the highest number of any member series of `scope` in `folder`.

    Every member of one `drop_members` call then shares a number, however the members'
    series were numbered before (members dropped alone number their own series).
    """
    highest = 0
    for i in range(batch):
        highest = max([highest, *(n for n, _ in _anchors(folder, member_stem(scope, i)))])
    return highest + 1


def newest_set(folder: Path, scope: str, batch: int) -> list[Path]:
    """The members' anchors of the highest number that every member of `scope` has.

    A set that lost a member (retention of members dropped alone, a deleted file) is passed
    over for the newest whole one. CheckpointError if there is none.
    """
    series = [dict(_anchors(folder, member_stem(scope, i))) for i in range(batch)]
    common = set(series[0]).intersection(*series[1:])
    if not common:
        missing = "" if folder.is_dir() else "; there is no such folder"
        raise CheckpointError(
            f"no whole set of {batch} member anchors of scope {scope!r} in {folder} (looked "
            f"for {member_stem(scope, 0)}-<n>{SUFFIX} ... {member_stem(scope, batch - 1)}-<n>"
            f"{SUFFIX} with one n{missing})"
        )
    n = max(common)
    return [s[n] for s in series]


def check_unnumbered(path: Path, file: str | os.PathLike) -> None:
    """Refuses a name the user gives in a form only `drop` writes: numbered or a member's.

    `drop_members` replaces a named set's files, deleting a smaller set's leftovers, so a
    name of the member form ``<name>%m<i>`` would be a file the user named that it deletes.
    """
    if _MEMBER_FORM.fullmatch(path.name):
        raise bad_argument(
            "file",
            os.fspath(file),
            "a name without the member form <name>%m<digits>.safetensors, which "
            "drop_members() keeps for the members of a named set",
        )
    if _NUMBERED_FORM.fullmatch(path.name):
        raise bad_argument(
            "file",
            os.fspath(file),
            "a name without the numbered-anchor form <name>-<digits>.safetensors, which "
            "drop() keeps for the anchors it numbers (and retention deletes); e.g. "
            f"{path.name[: -len(SUFFIX)].rpartition('-')[0]}_"
            f"{path.name[: -len(SUFFIX)].rpartition('-')[2]}",
        )


def next_numbered(folder: Path, stem: str) -> Path:
    """The next numbered anchor of `stem` in `folder`: one past the highest on disk."""
    numbers = [n for n, _ in _anchors(folder, stem)]
    return folder / f"{stem}-{max(numbers, default=0) + 1}{SUFFIX}"


def newest(folder: Path, scope: str, member: int | None = None) -> Path:
    """The highest-numbered anchor of `scope` (or of its member) in `folder`.

    CheckpointError if it has none.
    """
    stem = anchor_stem(scope) if member is None else member_stem(scope, member)
    found = _anchors(folder, stem)
    if not found:
        missing = "" if folder.is_dir() else "; there is no such folder"
        whose = f"scope {scope!r}" if member is None else f"member {member} of scope {scope!r}"
        raise CheckpointError(
            f"no anchor of {whose} in {folder} (looked for {stem}-<n>{SUFFIX}{missing})"
        )
    return found[-1][1]


def keep_newest(folder: Path, stem: str, keep: int) -> None:
    """Deletes all but the newest `keep` numbered anchors of `stem` in `folder`."""
    anchors = _anchors(folder, stem)
    for _, path in anchors[: max(0, len(anchors) - keep)]:
        path.unlink(missing_ok=True)


def inside(base: Path | None, file: str | os.PathLike) -> Path:
    """`file` under `base`, refused if, relative, it leads out of `base` (``..``)."""
    try:
        text = os.fspath(file)
    except TypeError as err:
        raise bad_argument("file", file, "a str or os.PathLike") from err
    if not isinstance(text, str):
        raise bad_argument("file", file, "a str or os.PathLike naming a str path")
    where = f"inside {base}" if base is not None else "inside the current folder"
    # Normalised first: "sub/..", "." and "./" name the folder itself, not a file in it.
    rel = os.path.normpath(text)
    if not os.path.isabs(rel) and (rel == os.pardir or rel.startswith(os.pardir + os.sep)):
        raise bad_argument(
            "file", text, f"a name that stays {where} (no '..' out), or an absolute path"
        )
    if text.endswith(("/", os.sep)) or rel in (os.curdir, os.sep, "//"):
        raise bad_argument("file", text, f"a file name {where}, not a folder")
    if os.path.isabs(rel):
        return Path(rel)
    return base / rel if base is not None else Path(rel)


def absent(file: Any) -> bool:
    """`file` left out: "" or None (a `Path("")` names the current folder and is refused)."""
    return file is None or (isinstance(file, str) and file == "")


def with_suffix(path: Path) -> Path:
    """`path` with ``.safetensors`` appended, unless its name ends with it."""
    return path if path.name.endswith(SUFFIX) else path.with_name(path.name + SUFFIX)


def _anchors(folder: Path, stem: str) -> list[tuple[int, Path]]:
    """The numbered anchors ``<stem>-<n>.safetensors`` in `folder`, by n.

    Names are matched exactly (no glob), so a stem with ``[``, ``*`` or ``?`` is its own; the
    number is ASCII digits without a leading zero, and only regular files count (a folder or
    a dangling link of that name is neither loaded nor deleted).
    """
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    found = []
    for entry in entries:
        match = _NUMBERED.fullmatch(entry.name)
        if match is None or match["stem"] != stem:
            continue
        try:
            regular = entry.is_file()
        except OSError:
            regular = False
        if regular:
            found.append((int(match["n"]), folder / entry.name))
    return sorted(found)
