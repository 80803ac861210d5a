"""Atomic file writes: a temporary name that says who wrote it, then one rename.

Every file dualtrain writes for the user (checkpoints, packs) goes through here, so that

- a reader never sees half a file under its final name: the bytes go to a temporary file in
  the same folder, are flushed to disk (``fsync``) and renamed over the final name;
- the file gets the permissions of the process umask (``0o666 & ~umask``, 0644 typically),
  like any file the user writes: `temp_path` creates it so and `commit` sets them again,
  since some writers (safetensors, ``tempfile.mkstemp``) create their files 0600;
- the temporary files of a killed writer are recognisable and cleaned up. Their name is::

      .<final name>.<host>-<pid>-<token>.dt-tmp

  where ``host`` is a short hash of the writer's host name and ``pid`` its process id (a
  final name too long to fit in it is written ``<hash>~<end of the name>``). The
  next write to the same folder (`atomic_target`, or `sweep_stale` called by a writer)
  removes every such file whose writer ran on this host and is gone. A live writer's
  files, another host's files (a shared folder), and files of unknown form are never
  touched;
- a failed write (a full disk, an exception in the caller) reports its own error and leaves
  no temporary file: removing the temporary file never hides the error that caused it.

Two ways to use it::

    with atomic_target(final) as tmp:      # one-shot writers
        write_everything(tmp)
    # renamed to `final` here; removed if the block raised

    tmp = temp_path(final)                 # writers that live longer (an open HDF5 file)
    try:
        ...write to tmp...
        commit(tmp, final)
    except BaseException:
        discard(tmp)
        raise
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import os
import re
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "TEMP_SUFFIX",
    "atomic_target",
    "commit",
    "discard",
    "disk_error",
    "is_temp",
    "sweep_stale",
    "temp_path",
    "umask",
    "writer_of",
]

TEMP_SUFFIX = ".dt-tmp"
_TEMP = re.compile(
    r"^\.(?P<final>.+)\.(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-(?P<token>[0-9a-f]{8})"
    + re.escape(TEMP_SUFFIX)
    + "$"
)


def _host() -> str:
    """8 hex digits naming this host, so a shared folder's sweep spares other hosts' writers."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def temp_path(final: str | os.PathLike) -> Path:
    """Creates and returns a new, empty temporary file for `final`, in `final`'s folder.

    The folder is created if needed. The file is created exclusively with mode ``0o666``
    (the umask applies), so writers that open it again by name (safetensors, h5py, numpy)
    keep those permissions. Its name is ``.<final name>.<host>-<pid>-<token>.dt-tmp``.

    Args:
        final: the path the file will be renamed to by `commit`.

    Returns:
        The temporary file's path.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{_short(final.name)}.{_host()}-{os.getpid()}-"
    while True:
        tmp = final.parent / f"{prefix}{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # 32 random bits collided: draw again
            continue
        os.close(fd)
        return tmp


# A file name's limit on common filesystems (ext4, xfs, btrfs, APFS, NTFS: 255 bytes).
_NAME_MAX = 255
# What the temporary name adds to the final one: ".", ".<host>-<pid>-<token>", the suffix.
_WRAPPER = 1 + 1 + 8 + 1 + 10 + 1 + 8 + len(TEMP_SUFFIX)


def _short(name: str) -> str:
    """`name` as the temporary name holds it: whole when it fits, else shortened.

    A final name near the limit would make the temporary name too long (ENAMETOOLONG on a
    name the user never gave); it is then cut to ``<hash>~<end of the name>``: the hash
    keeps two long names apart and the end keeps the extension, which sweeps match on.
    """
    room = _NAME_MAX - _WRAPPER
    if len(name.encode()) <= room:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    tail = name.encode()[-(room - 9) :].decode("utf-8", errors="ignore")
    return f"{digest}~{tail}"


def is_temp(path: str | os.PathLike) -> bool:
    """Whether `path`'s name has the form `temp_path` gives."""
    return _TEMP.match(Path(path).name) is not None


def writer_of(path: str | os.PathLike) -> tuple[str, int, str] | None:
    """``(final name, writer pid, host hash)`` of a temporary file's name, or None."""
    match = _TEMP.match(Path(path).name)
    if match is None:
        return None
    return match["final"], int(match["pid"]), match["host"]


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed but not yet reaped, counts as gone)."""
    if pid <= 0:
        return True  # not a pid a writer can have: leave its files alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs (macOS) or the process just ended: be conservative
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def sweep_stale(folder: str | os.PathLike, final_name_glob: str | None = None) -> list[Path]:
    """Removes the temporary files in `folder` whose writer (on this host) is gone.

    Args:
        folder: where to look (not recursive). A missing folder has nothing to sweep.
        final_name_glob: only temporary files of final names matching this `fnmatch`
            pattern (``"*.safetensors"``); None sweeps every final name.

    Returns:
        The files removed. Files that vanish meanwhile (another sweeper) or cannot be
        removed are skipped silently: sweeping is housekeeping and never fails a write.
    """
    folder = Path(folder)
    host, me = _host(), os.getpid()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        parsed = writer_of(entry.name)
        if parsed is None or not entry.is_file(follow_symlinks=False):
            continue
        final, pid, writer_host = parsed
        if writer_host != host or pid == me or _alive(pid):
            continue
        if final_name_glob is not None and not fnmatch.fnmatchcase(final, final_name_glob):
            continue
        path = folder / entry.name
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def umask() -> int:
    """The process umask, read without changing it where the platform tells it (Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not atomic across threads)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    """Makes a rename in `folder` durable (where the platform allows opening a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on a folder
            os.fsync(fd)
    finally:
        os.close(fd)


def commit(
    tmp: str | os.PathLike, final: str | os.PathLike, durable: bool = True, replace: bool = True
) -> None:
    """Gives `tmp` the umask's permissions and renames it over `final`, atomically.

    Args:
        tmp: a file from `temp_path`, closed by its writer.
        final: the path it was made for (same folder).
        durable: ``fsync`` the file before and the folder after the rename, so that the
            final name holds the whole file even after a power loss (a killed process
            needs no fsync: the kernel still writes its pages). A disk error that the
            filesystem reports only at sync time is raised here, before the rename.
        replace: replace a file at `final`. If False, `final` is created only if no file
            has that name, atomically (a hard link, then `tmp` is removed), so that two
            writers choosing the same new name never replace each other's file.

    Raises:
        OSError: the disk's error (ENOSPC, EIO, ...); `final` is left as it was and `tmp`
            is left for the caller to `discard`.
        FileExistsError: `replace` is False and `final` exists; `tmp` is left as above.
    """
    tmp, final = Path(tmp), Path(final)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        # Some writers (safetensors) create their file 0600 whatever the umask: set it.
        os.fchmod(fd, 0o666 & ~umask())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if replace:
        os.replace(tmp, final)
    else:
        _link(tmp, final)
    if durable:
        _fsync_dir(final.parent)


def _link(tmp: Path, final: Path) -> None:
    """Moves `tmp` to `final` unless `final` exists (FileExistsError), atomically."""
    try:
        os.link(tmp, final)
    except FileExistsError:
        raise
    except OSError as err:
        # No hard links here (some network and FAT filesystems): check, then rename. Two
        # writers may still race between the two, as they would without this option.
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if os.path.lexists(final):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(final)) from err
        os.replace(tmp, final)
        return
    with contextlib.suppress(OSError):
        tmp.unlink()


def discard(tmp: str | os.PathLike) -> None:
    """Removes a temporary file, never raising: the caller is already handling an error."""
    with contextlib.suppress(OSError):
        Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_target(
    final: str | os.PathLike, durable: bool = True, replace: bool = True
) -> Iterator[Path]:
    """Yields a temporary path to write `final` to; renames it to `final` when the block ends.

    First sweeps the stale temporary files of dead writers from `final`'s folder. If the
    block raises (or the rename fails), the temporary file is removed and the block's own
    exception propagates unchanged; `final` is never touched.

    Args:
        final: the file to write.
        durable: see `commit`.
        replace: see `commit` (False: FileExistsError if `final` exists, nothing left).

    Yields:
        The temporary file's path (it exists, empty; writers may truncate it).
    """
    final = Path(final)
    tmp = temp_path(final)
    sweep_stale(final.parent)
    try:
        yield tmp
        commit(tmp, final, durable, replace)
    except BaseException:
        discard(tmp)
        raise


def disk_error(err: BaseException, path: str | os.PathLike) -> OSError | None:
    """The OSError behind a library's wrapped I/O error (``... (os error 28)``), or None.

    Writers that go through a library which reports disk errors as its own exception type
    (safetensors) use this to raise the disk's error itself, with `path`.
    """
    if isinstance(err, OSError):
        return err
    match = re.search(r"os error (\d+)", str(err))
    if match is None:
        return None
    code = int(match.group(1))
    return OSError(code, os.strerror(code) if code in errno.errorcode else str(err), str(path))
