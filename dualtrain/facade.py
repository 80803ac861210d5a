"""Lazy package facades (PEP 562): each public name imports its module on first use.

A package calls `lazy` with its name table and gets the module-level ``__getattr__`` and
``__dir__`` to bind: ``import dualtrain_torch`` then imports no submodule, and a name, once
loaded, is cached in the package so later look-ups never reach ``__getattr__``. A seed
tool's spelling that moved to a compat namespace (`dualtrain.deprecation.SEED_SPELLINGS`) is
served each time with its DeprecationWarning, never cached.

The two adapters' facades mirror each other (tests/test_facades.py): the names they share
and the modules they both moved (#32) are declared once here, by their paths below the
adapter; each adapter adds only what carries its framework or only it had.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SHARED_HOMES", "SHARED_MOVES", "adapter_homes", "adapter_moves", "lazy"]

# The public names both adapters export -> the module below the adapter that defines each.
SHARED_HOMES: Mapping[str, str] = {
    "BatchModule": "batching",
    "batch_loss": "batching",
    "batch_topk": "batching",
    "member_optimizer": "batching.optim",
    "TrainingLearner": "compilation.learner",
    "accelerate": "compilation",
    "accelerate_model": "compilation",
    "Nozzle": "craft",
    "Prober": "craft",
    "Rudder": "craft",
    "Transfer": "transfer",
    "attach": "embeddings",
    "coat": "craft",
    "realize": "craft",
    "shell": "craft",
}

# The modules both adapters moved into capability subpackages (#32): old name -> new name,
# below the adapter. The old names still import (`dualtrain.deprecation.moved_modules`).
SHARED_MOVES: Mapping[str, str] = {
    "batching_loss": "batching.loss",
    "batching_members": "batching.members",
    "batching_optim": "batching.optim",
    "batching_probe": "batching.probe",
    "batching_run": "batching.run",
    "compilation_keys": "compilation.keys",
    "compilation_learner": "compilation.learner",
    "compilation_module": "compilation.module",
    "compilation_probe": "compilation.probe",
    "compilation_rungs": "compilation.rungs",
    "distributed_learner": "distributed.learner",
    "distributed_reduce": "distributed.reduce",
    "distributed_rows": "distributed.rows",
}


def adapter_homes(package: str, own: Mapping[str, str]) -> dict[str, str]:
    """The name table `lazy` takes for adapter `package`: `SHARED_HOMES` and its `own`.

    `own` maps the names only this adapter has (``"TorchRows"``) to their modules below it.
    """
    return {name: f"{package}.{home}" for name, home in {**SHARED_HOMES, **own}.items()}


def adapter_moves(package: str, own: Mapping[str, str]) -> dict[str, str]:
    """The old -> new module names of adapter `package`: `SHARED_MOVES` and its `own`.

    What ``dualtrain.deprecation.moved_modules`` takes; `own` holds the moves only this
    adapter made, below it (``{"compile_cache": "compilation.cache"}``).
    """
    return {f"{package}.{old}": f"{package}.{new}" for old, new in {**SHARED_MOVES, **own}.items()}


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
