"""The decision cache: a ladder's verdict on disk, so a second run skips the trials.

One small JSON file per key, where the key hashes everything the verdict depends on: the
model's structure (class, parameter and buffer names, shapes, dtypes), the mode, the input
signature, the device, the rungs asked for, the options, and the versions of Python, the
framework and dualtrain. Files are written to a temporary name and renamed
(`dualtrain.atomic`); a file that does not parse is ignored and replaced. The folder is
``$DUALTRAIN_CACHE_DIR/accelerate``, else ``$XDG_CACHE_HOME/dualtrain/accelerate``, else
``~/.cache/dualtrain/accelerate``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import platform
import sys
import types
from pathlib import Path
from typing import Any

from dualtrain.accelerate.report import Decision
from dualtrain.atomic import atomic_target
from dualtrain.caches import cache_folder
from dualtrain.version import __version__

__all__ = ["DecisionCache", "code_digest", "default_folder", "fingerprint", "function_digest"]

_FORMAT = 2  # bump when the file's fields change meaning (2: speed-ups over `speedup_over`)


def default_folder() -> Path | None:
    """Where decisions are kept when ``cache=True`` (None: nowhere to keep them)."""
    return cache_folder("accelerate")


def fingerprint(parts: dict[str, Any]) -> str:
    """A hex key for `parts` (JSON-able), with Python's and dualtrain's versions mixed in."""
    full = {
        "format": _FORMAT,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "dualtrain": __version__,
        **parts,
    }
    text = json.dumps(full, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class DecisionCache:
    """Decisions by key in `folder` (None: a cache that keeps nothing)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{key}.json"

    def get(self, key: str) -> Decision | None:
        """The decision stored under `key`, or None (absent, unreadable or of another format)."""
        if self.folder is None:
            return None
        try:
            data = json.loads(self._path(key).read_text())
            if data.get("format") != _FORMAT or data.get("key") != key:
                return None
            decision = Decision.from_dict(data["decision"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            # AttributeError: JSON that is no object ("[]", "null") has no .get
            return None
        decision.from_cache = True
        return decision

    def put(self, key: str, decision: Decision) -> None:
        """Stores `decision` under `key`; a folder that cannot be written is skipped."""
        if self.folder is None:
            return
        data = {"format": _FORMAT, "key": key, "decision": decision.to_dict()}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_target(self._path(key)) as tmp:
                Path(tmp).write_text(json.dumps(data, indent=1, sort_keys=True))
        except OSError:
            # A read-only home or a full disk costs the next run its trials, nothing more.
            return

    def clear(self) -> int:
        """Removes every stored decision; returns how many."""
        if self.folder is None or not self.folder.is_dir():
            return 0
        count = 0
        for path in self.folder.glob("*.json"):
            path.unlink(missing_ok=True)
            count += 1
        return count


def _feed(h: Any, obj: Any, depth: int, seen: set[int]) -> None:
    # A stable digest of code and configuration: functions by bytecode and closure, values
    # by repr, containers by contents, anything else by its type (never by address).
    if depth < 0 or id(obj) in seen:
        h.update(b"~")
        return
    if isinstance(obj, (str, bytes, int, float, complex, bool, type(None))):
        h.update(repr(obj).encode())
        return
    seen.add(id(obj))
    if isinstance(obj, functools.partial):
        _feed(h, (obj.func, obj.args, obj.keywords), depth - 1, seen)
    elif isinstance(obj, types.MethodType):
        _feed(h, (obj.__func__, type(obj.__self__).__qualname__), depth - 1, seen)
    elif isinstance(obj, types.FunctionType):
        h.update(f"{obj.__module__}.{obj.__qualname__}".encode())
        _code(h, obj.__code__)
        for cell in obj.__closure__ or ():
            try:
                _feed(h, cell.cell_contents, depth - 1, seen)
            except ValueError:  # an empty cell
                h.update(b"<empty>")
        _feed(h, obj.__defaults__, depth - 1, seen)
    elif isinstance(obj, (set, frozenset)):  # iteration order follows (seeded) str hashes
        h.update(repr(sorted(map(repr, obj))).encode())
    elif isinstance(obj, (tuple, list)):
        h.update(b"(")
        for item in obj:
            _feed(h, item, depth - 1, seen)
        h.update(b")")
    elif isinstance(obj, dict):
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode())
            _feed(h, obj[k], depth - 1, seen)
    else:
        h.update(f"{type(obj).__module__}.{type(obj).__qualname__}".encode())


def _code(h: Any, code: types.CodeType) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code(h, const)
        elif isinstance(const, frozenset):  # `x in {"a", "b"}`: repr order follows str hashes
            h.update(repr(sorted(map(repr, const))).encode())
        else:
            h.update(repr(const).encode())


def code_digest(obj: Any) -> str:
    """A hex digest of a function's code and closure (or of a value), stable across runs.

    Functions count by bytecode, names, constants, closure and defaults; values by repr;
    containers by contents; anything else by its type, never by its address. A cached
    decision is trusted without trials, so a changed ``forward`` / ``run`` must be another
    key.
    """
    h = hashlib.sha256()
    _feed(h, obj, 6, set())
    return h.hexdigest()[:16]


def function_digest(fn: Any) -> str:
    """`code_digest` of a callable, reaching the code that `code_digest` alone would not.

    ``code_digest`` keys a non-function by its type only: every ``jax.jit`` object would be
    one function, and every instance of a callable class one, whatever its ``__call__`` code
    or attributes. A cached decision is trusted without trials, so both must count: the
    wrapped function (``__wrapped__``, as ``jax.jit`` and ``functools.wraps`` keep it) and a
    callable object's ``__call__`` and attributes.
    """
    parts: list[Any] = [fn]
    try:
        inner = inspect.unwrap(fn)
    except ValueError:  # a __wrapped__ chain that loops
        inner = fn
    if inner is not fn:
        parts.append(inner)
    if not isinstance(inner, (types.FunctionType, types.MethodType, functools.partial)):
        parts.append((type(inner).__call__, getattr(inner, "__dict__", None)))
    return code_digest(parts)
