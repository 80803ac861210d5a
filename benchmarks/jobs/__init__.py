"""The whole-job benchmarks' registry: every job module's ``JOBS``, for bench_jobs.

Each job module (a script too: ``python benchmarks/jobs/<name>.py ...`` runs one way of one
job) defines ``JOBS: list[Job]``. `collect` imports them in `MODULES` order; a module that is
not there is skipped with a printed line. Importing this package imports no job module, so a
job script's own start-up (``from jobs.common import ...``) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

MODULES = ("sweeps", "ladder", "multiverse", "tank", "store")


def collect(modules: tuple[str, ...] = MODULES) -> list[Any]:
    """Every job of the modules present, in order (a list of `jobs.common.Job`)."""
    found: list[Any] = []
    for name in modules:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise  # the module is there but imports something missing: say so
            print(f"bench_jobs: no job module benchmarks/jobs/{name}.py; its jobs are skipped")
            continue
        found.extend(module.JOBS)
    return found


def __getattr__(name: str) -> Any:
    if name == "JOBS":  # `from jobs import JOBS`: collected on first use
        return collect()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
