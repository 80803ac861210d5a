"""The byte budget: its default, and the ledger every admission goes through.

A ledger holds the bytes a cache holds against its limit. `try_add(n)` admits n bytes only
if they fit, so the held bytes never pass the limit; `sub(n)` gives them back. One process
uses a `LocalLedger`; a cache shared with worker processes moves its count into the
`SharedLedger` of its shared store (`dualtrain.preload.shared`), so every process admits
against the same limit.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from dualtrain.errors import ArgumentError, bad_argument

__all__ = ["DEFAULT_FRACTION", "LocalLedger", "available_memory", "check_budget", "default_budget"]

# The default budget: this share of the memory available when the cache is made
# (nebulgym's default was a quarter too).
DEFAULT_FRACTION = 0.25
_FALLBACK = 1 << 30  # bytes, where the system does not say what is available


def available_memory() -> int:
    """Bytes of memory available to new allocations (Linux: MemAvailable), 1 GiB if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return _FALLBACK


def default_budget() -> int:
    """`DEFAULT_FRACTION` of the memory available now, in bytes."""
    return int(available_memory() * DEFAULT_FRACTION)


def check_budget(max_memory_size: object) -> int:
    """A budget in bytes: an int >= 0, or None for `default_budget()`."""
    if max_memory_size is None:
        return default_budget()
    if isinstance(max_memory_size, np.integer):
        max_memory_size = int(max_memory_size)
    if isinstance(max_memory_size, bool) or not isinstance(max_memory_size, int):
        raise bad_argument(
            "max_memory_size", max_memory_size, "an int number of bytes >= 0, or None"
        )
    if max_memory_size < 0:
        raise bad_argument("max_memory_size", max_memory_size, "an int number of bytes >= 0")
    return max_memory_size


class LocalLedger:
    """Bytes held by one process's cache, against `limit`."""

    def __init__(self, limit: int, used: int = 0) -> None:
        self.limit = limit
        self._used = used
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    def free(self) -> int:
        """Bytes that can still be admitted."""
        return self.limit - self._used

    def try_add(self, n: int) -> bool:
        """Admits `n` bytes if they fit under the limit; False (nothing changed) if not."""
        check_bytes(n)
        with self._lock:
            if self._used + n > self.limit:
                return False
            self._used += n
            return True

    def sub(self, n: int) -> None:
        """Gives back `n` bytes admitted before."""
        check_bytes(n)
        with self._lock:
            if n > self._used:
                raise ArgumentError(f"the ledger cannot give back {n} bytes: it holds {self._used}")
            self._used -= n


def check_bytes(n: object) -> int:
    """A byte count for a ledger: an int >= 0.

    The ledger's law (0 <= used <= limit) rests on it; `nbytes` refuses a user's bad count
    before it gets here.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ArgumentError(f"a ledger counts bytes as an int >= 0; got {n!r}")
    return n
