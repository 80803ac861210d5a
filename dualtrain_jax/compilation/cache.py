"""XLA's compiled programs kept on disk, so a second run of a job skips its compiles.

torch's compiler keeps what it compiled on disk by default (TorchInductor's cache); JAX
keeps it only when a process names a folder (``jax_compilation_cache_dir``). A sweep or a
ladder decision whose whole cost is compiling paid it again on every run, so dualtrain
names one the first time it compiles for you: ``cache_folder("xla")``, beside its other
caches (``$DUALTRAIN_CACHE_DIR/xla``). JAX's own rules stay in force: only programs that
took ``jax_persistent_cache_min_compile_time_secs`` (1 s by default) to compile are kept,
and keys cover the program, the JAX and XLA versions, the flags and the devices.

One exception to that threshold, in the calling thread only: op-by-op JAX, the ladder's
reference (`every_program_kept`). It compiles one small program per primitive (a CNN's
training step: 159 of them, 33 ms each, 5 of the 7 s its check takes), none of which
reaches 1 s, so a job that ended before its start was verified paid them all again in the
next run; kept, the next run's check loads them and finishes.

Left alone: a folder the user named (``JAX_COMPILATION_CACHE_DIR`` or the config), and
``jax_enable_compilation_cache=False`` (JAX's own off switch; in the environment
``JAX_ENABLE_COMPILATION_CACHE=false``).
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax

from dualtrain.caches import cache_folder

__all__ = ["every_program_kept", "use_disk_cache"]

_ENTRY_SUFFIX = "-cache"  # JAX's name for an entry: <key>-cache
_STAMP = ".dualtrain-checked"  # touched after each check of the entries written since
_JAX_DEFAULT_THRESHOLD_S = 1.0  # jax_persistent_cache_min_compile_time_secs's default
_lock = threading.Lock()
_chosen: list[Path | None] = []  # the decision, taken once per process


def use_disk_cache() -> Path | None:
    """Names dualtrain's folder as JAX's compilation cache, once per process.

    Returns the folder in use because of this call (None when the user chose otherwise,
    JAX's cache is off, or there is no folder to name: see `dualtrain.caches`).
    """
    with _lock:
        if not _chosen:
            _chosen.append(_choose())
        return _chosen[0]


@contextlib.contextmanager
def every_program_kept() -> Iterator[None]:
    """Within it, this thread's compiles are kept in dualtrain's folder however short.

    Only when that folder is JAX's cache because of `use_disk_cache` and the threshold is
    JAX's default (a folder or threshold the user chose is left alone); JAX's threshold is
    set for the calling thread alone.
    """
    from jax._src import config  # the thread-local form of the option is JAX's own

    threshold = getattr(config, "persistent_cache_min_compile_time_secs", None)
    with _lock:
        ours = bool(_chosen) and _chosen[0] is not None
    if not ours or not callable(threshold) or threshold.value != _JAX_DEFAULT_THRESHOLD_S:
        yield
        return
    with threshold(0.0):
        yield


def _choose() -> Path | None:
    settings: Any = jax.config  # its options are attributes mypy cannot see
    if not settings.jax_enable_compilation_cache or settings.jax_compilation_cache_dir:
        return None
    folder = cache_folder("xla")
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        drop_torn_entries(folder)
    except OSError:  # a read-only home: compile as before, keep nothing
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    return folder


def drop_torn_entries(folder: Path) -> list[Path]:
    """Deletes the entries written since the last check that do not decompress.

    JAX writes an entry in place, so a process killed mid-write leaves a truncated one,
    and JAX, finding the name taken, never rewrites it: every later run would warn and
    compile again. Entries are checked once (those newer than the stamp of the last
    check). Returns the deleted paths.
    """
    stamp = folder / _STAMP
    try:
        since = stamp.stat().st_mtime - 60.0  # slack for coarse file-system clocks
    except FileNotFoundError:
        since = float("-inf")
    dropped = []
    for entry in folder.glob("*" + _ENTRY_SUFFIX):
        try:
            if entry.stat().st_mtime < since or _readable(entry.read_bytes()):
                continue
            entry.unlink()
        except FileNotFoundError:  # another process dropped it first
            continue
        dropped.append(entry)
    stamp.touch()
    return dropped


def _readable(data: bytes) -> bool:
    """Whether `data` is a whole compressed entry (in the codec JAX writes with)."""
    from jax._src import compilation_cache  # the codec is JAX's choice, not ours

    try:
        compilation_cache.decompress_executable(data)
    except (zlib.error, ValueError, RuntimeError, OSError, EOFError):
        return False
    except Exception as error:  # zstandard's ZstdError derives from Exception only
        if type(error).__name__ in ("ZstdError", "ZstdDecompressionError"):
            return False
        raise
    return True
