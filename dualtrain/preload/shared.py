"""A cache's items shared by processes: one file per item in a RAM-backed folder.

DataLoader workers (fork or spawn) and a Tank's worker processes each hold a copy of the
dataset, so an in-memory cache would be one per worker and lost with it. A shared cache
keeps its items in a folder under ``/dev/shm`` (memory, not disk; the system's temporary
folder where there is none), one pickled item per file, written to a temporary name and
renamed, so a reader sees a whole item or none. The bytes held are what the files take
(whole blocks: tmpfs gives even a small file one); a ledger file, locked (``lockf``)
around every admission, keeps their sum at or below the budget across all processes. The
owner's own items move into the folder when it is first shared.

Only the process that made the folder removes it (at exit or when its cache goes away); a
folder whose owner was killed is removed by the next one made on the machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import shutil
import struct
import tempfile
import threading
from collections.abc import Hashable, Iterator
from typing import Any

from dualtrain.preload.budget import check_bytes
from dualtrain.preload.pickling import dumps

__all__ = ["COUNTERS", "SharedStore"]

PREFIX = "dualtrain-preload-"
_LEDGER = "ledger"
_STATS = "stats-"
# The counters each worker process keeps in its own stats file, in this order.
COUNTERS = ("hits", "misses", "loads", "not_kept", "data_wait_ns")
_RECORD = struct.Struct(f"<{len(COUNTERS)}q")
# One process's counters per folder, summed over every cache of that folder in the process:
# a cache is unpickled again for each task a process pool runs (a Tank's process workers),
# and each copy's counts must add up in the process's one stats file, written through one
# open file. Keyed by (pid, folder): a forked child starts its own.
_TOTALS: dict[tuple[int, str], list[int]] = {}
_FDS: dict[tuple[int, str], int] = {}
_TOTALS_LOCK = threading.Lock()


_thread_locks: dict[str, threading.Lock] = {}  # per folder, in this process
_thread_locks_guard = threading.Lock()


def _thread_lock(path: str) -> threading.Lock:
    with _thread_locks_guard:
        lock = _thread_locks.get(path)
        if lock is None:
            lock = _thread_locks[path] = threading.Lock()
        return lock


def _fresh_locks_in_child() -> None:
    # A lock another thread of the parent held at the fork stays held in the child for good.
    global _thread_locks_guard
    _thread_locks_guard = threading.Lock()
    _thread_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)


def _base_dir() -> str:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep(base: str | None = None) -> list[str]:
    """Removes shared folders whose owner process is gone; returns their paths."""
    base = base or _base_dir()
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        pid_text = name[len(PREFIX) :].partition("-")[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not _alive(int(pid_text)):
            path = os.path.join(base, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _token(key: Hashable) -> str | None:
    """A file name for `key` (None: the key cannot be named, so it is not shared)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"i{key}"
    if isinstance(key, str):
        return "s" + hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()
    try:
        return "p" + hashlib.sha1(pickle.dumps(key, protocol=5)).hexdigest()
    except Exception:  # an unpicklable key: not shared, loaded every time
        return None


class SharedStore:
    """The shared folder of one cache: its items, its ledger and its workers' counters.

    Args:
        path: the folder (made by `create`).
        limit: the budget in bytes.
    """

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit = path, limit
        try:  # the folder's block size: a file takes whole blocks of it (4 KiB on tmpfs)
            self.page = max(1, os.statvfs(path).f_bsize)
        except (OSError, AttributeError):
            self.page = 4096
        self._recorded = [0] * len(COUNTERS)  # this store's counts already in the totals
        # The process that made the folder, the only one that removes it (None: a worker's
        # view of it). A forked child holds a copy of the owner's store and of the finalizer
        # that calls `remove`: without this a child exiting normally would remove the folder.
        self._owner_pid: int | None = None

    @classmethod
    def create(cls, limit: int, used: int) -> SharedStore:
        """A new folder owned by this process, its ledger starting at `used` bytes."""
        sweep()
        path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=_base_dir())
        with open(os.path.join(path, _LEDGER), "wb") as f:
            f.write(struct.pack("<q", used))
        store = cls(path, limit)
        store._owner_pid = os.getpid()
        return store

    def __reduce__(self) -> tuple[Any, ...]:
        return (SharedStore, (self.path, self.limit))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        """The ledger's fd, held exclusively by this thread among every process.

        A POSIX record lock (``lockf``), not ``flock``: a child forked while this process
        held an flock would share the lock through its copy of the fd and hold it for
        good; record locks belong to the process and are not inherited. They do not
        exclude this process's other threads, so a thread lock comes first.
        """
        import fcntl  # POSIX: shared caches need it (Linux and macOS)

        with _thread_lock(self.path):
            # A folder removed under us (its owner exited) raises here: callers treat it
            # as full.
            fd = os.open(os.path.join(self.path, _LEDGER), os.O_RDWR)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                yield fd
            finally:
                os.close(fd)  # closing releases the lock

    @staticmethod
    def _read_used(fd: int) -> int:
        return int(struct.unpack("<q", os.pread(fd, 8, 0))[0])

    @property
    def used(self) -> int:
        """Bytes held against the budget, by every process (0 once the folder is gone)."""
        try:
            with self._locked() as fd:
                return self._read_used(fd)
        except FileNotFoundError:
            return 0

    def free(self) -> int:
        return self.limit - self.used

    def try_add(self, n: int) -> bool:
        """Admits `n` bytes if they fit under the limit; False (nothing changed) if not."""
        check_bytes(n)
        try:
            with self._locked() as fd:
                used = self._read_used(fd)
                if used + n > self.limit:
                    return False
                os.pwrite(fd, struct.pack("<q", used + n), 0)
                return True
        except FileNotFoundError:
            return False

    def sub(self, n: int) -> None:
        check_bytes(n)
        try:
            with self._locked() as fd:
                os.pwrite(fd, struct.pack("<q", self._read_used(fd) - n), 0)
        except FileNotFoundError:
            pass

    def read(self, key: Hashable) -> tuple[bool, Any]:
        """(True, item) if another process (or this one) stored `key`; else (False, None)."""
        token = _token(key)
        if token is None:
            return False, None
        try:
            with open(os.path.join(self.path, token), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return False, None
        return True, pickle.loads(data)

    def write(self, key: Hashable, item: Any) -> bool:
        """Stores `item` if it pickles and fits; False when it is not kept (nothing changed)."""
        token = _token(key)
        if token is None:
            return False
        try:
            data = dumps(item)
        except Exception:  # not picklable: served, not shared
            return False
        final = os.path.join(self.path, token)
        try:
            return self._write(final, data)
        except FileNotFoundError:  # the folder is gone
            return False

    def charge(self, size: int) -> int:
        """What a file of `size` bytes takes: whole pages (tmpfs gives a file at least one)."""
        return -(-size // self.page) * self.page

    def _write(self, final: str, data: bytes) -> bool:
        cost = self.charge(len(data))
        with self._locked() as fd:
            used = self._read_used(fd)
            if os.path.exists(final) or used + cost > self.limit:
                return False
            # The bytes are counted before the file is written: a process killed while
            # writing leaves the ledger over (never under) what the folder holds, so the
            # budget still bounds the memory the folder takes.
            os.pwrite(fd, struct.pack("<q", used + cost), 0)
            temp = f"{final}.tmp{os.getpid()}"
            try:
                with open(temp, "wb") as f:
                    f.write(data)
                os.replace(temp, final)
            except OSError:  # the folder's file system is full: the item is not kept
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                os.pwrite(fd, struct.pack("<q", used), 0)
                return False
        return True

    def record(self, counts: dict[str, int]) -> None:
        """Adds this cache's counters to its process's, where the owner's `stats()` sums them.

        `counts` are this cache's totals so far; the process's stats file holds the sum over
        every cache of this folder in the process.
        """
        values = [counts.get(k, 0) for k in COUNTERS]
        place = (os.getpid(), self.path)
        with _TOTALS_LOCK:
            total = _TOTALS.setdefault(place, [0] * len(COUNTERS))
            for i, (new, old) in enumerate(zip(values, self._recorded, strict=True)):
                total[i] += new - old
            self._recorded = values
            fd = _FDS.get(place)
            if fd is None:
                name = os.path.join(self.path, f"{_STATS}{os.getpid()}")
                try:
                    self._retire_dead()  # workers of past epochs: one file, not one each
                    fd = _FDS[place] = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
                except OSError:  # the owner removed the folder: nothing to report to
                    return
            with contextlib.suppress(OSError):
                os.pwrite(fd, _RECORD.pack(*total), 0)

    def counters(self) -> dict[str, int]:
        """The workers' counters, summed.

        Read under the ledger's lock, so a process's counters folded into ``stats-0`` by
        `_retire_dead` are counted once, never twice or not at all.
        """
        total = dict.fromkeys(COUNTERS, 0)
        with contextlib.suppress(OSError), self._locked():
            for name in os.listdir(self.path):
                if (
                    not name.startswith(_STATS)
                    or name == f"{_STATS}{os.getpid()}"
                    or ".tmp" in name
                ):
                    continue
                for k, v in zip(COUNTERS, _read_record(os.path.join(self.path, name)), strict=True):
                    total[k] += v
        return total

    def _stats_pids(self) -> list[int]:
        """The pids of the processes with a counters file (0: the retired ones' sum)."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        tails = [n[len(_STATS) :] for n in names if n.startswith(_STATS)]
        return [int(t) for t in tails if t.isdigit()]

    def _retire_dead(self) -> None:
        """Folds the counters of processes that are gone into one file (``stats-0``)."""
        with self._locked():
            retired = os.path.join(self.path, f"{_STATS}0")
            total = list(_read_record(retired))
            dead = [p for p in self._stats_pids() if p not in (0, os.getpid()) and not _alive(p)]
            if not dead:
                return
            for pid in dead:
                record = _read_record(os.path.join(self.path, f"{_STATS}{pid}"))
                total = [a + b for a, b in zip(total, record, strict=True)]
            with open(retired + ".tmp", "wb") as f:
                f.write(_RECORD.pack(*total))
            os.replace(retired + ".tmp", retired)
            for pid in dead:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.path, f"{_STATS}{pid}"))

    def workers(self) -> bool:
        """Whether another live process uses the folder (it has a counters file)."""
        me = os.getpid()
        return any(p not in (0, me) and _alive(p) for p in self._stats_pids())

    def has(self, key: Hashable) -> bool:
        """Whether `key` is stored (by any process)."""
        token = _token(key)
        return token is not None and os.path.exists(os.path.join(self.path, token))

    def clear(self) -> None:
        """Removes every stored item, giving its bytes back to the ledger."""
        try:
            with self._locked() as fd:
                freed = 0
                for name in os.listdir(self.path):
                    if name[:1] in "isp" and ".tmp" not in name and not name.startswith(_STATS):
                        path = os.path.join(self.path, name)
                        with contextlib.suppress(OSError):
                            size = os.path.getsize(path)
                            os.unlink(path)
                            freed += self.charge(size)
                os.pwrite(fd, struct.pack("<q", max(0, self._read_used(fd) - freed)), 0)
        except FileNotFoundError:
            pass

    def files(self) -> int:
        """Items stored in the folder."""
        try:
            return sum(
                1 for n in os.listdir(self.path) if n[:1] in "isp" and ".tmp" not in n
                and not n.startswith(_STATS)
            )  # fmt: skip
        except OSError:
            return 0

    def remove(self) -> None:
        """Removes the folder, in the process that made it only (elsewhere nothing happens)."""
        if self._owner_pid == os.getpid():
            shutil.rmtree(self.path, ignore_errors=True)


def _read_record(path: str) -> tuple[int, ...]:
    """The counters in the file at `path`; zeros when it is gone or not yet whole."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_RECORD.size)
    except OSError:  # gone: retired by another process, or its folder removed
        raw = b""
    return _RECORD.unpack(raw) if len(raw) == _RECORD.size else (0,) * len(COUNTERS)
