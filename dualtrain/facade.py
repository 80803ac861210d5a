"""Lazy package facades (PEP 562): each public name imports its module on first use.

A package calls `lazy` with its name table and gets the module-level ``__getattr__`` and
``__dir__`` to bind: ``import dualtrain_torch`` then imports no submodule, and a name, once
loaded, is cached in the package so later look-ups never reach ``__getattr__``. A seed
tool's spelling that moved to a compat namespace (`dualtrain.deprecation.SEED_SPELLINGS`) is
served each time with its DeprecationWarning, never cached.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy"]


def lazy(
    package: str,
    homes: Mapping[str, str],
    *,
    moved: tuple[str, ...] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package `package`.

    Args:
        package: the package's ``__name__`` (its module must be importing, or imported).
        homes: public name -> the module that defines it.
        moved: seed spellings this package used to export, served with a warning.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:  # noqa: N807 - the PEP 562 hook's own name
        if name in moved:
            from dualtrain.deprecation import moved_attribute

            return moved_attribute(package, name, moved)  # not cached: each use warns
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
