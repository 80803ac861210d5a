"""Nebulae's ``nebulae.aerolog.DashBoard``: dualtrain's dashboard, counting from 0 as Nebulae.

Nebulae's loops run ``for mile in range(mpe)`` and hand `mile` and `epoch` to ``gauge``
as they come, from 0; its ``gauge`` added 1 to each. This one does the same and hands
dualtrain's `DashBoard.gauge` the 1-based step and epoch it takes, so curves, CSVs and
``read`` (whose epochs count from 1 in Nebulae too) are dualtrain's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.aerolog.dashboard import DashBoard as _DashBoard
from dualtrain.compat.nebulae.config import from_config
from dualtrain.errors import ArgumentError, bad_argument

__all__ = ["DashBoard"]

_KEYS = ("log_path", "window", "divisor", "span", "format")


def _count(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise bad_argument(name, value, f"an int >= 0 (Nebulae counts {name}s from 0)")
    return int(value)


class DashBoard(_DashBoard):
    """``DashBoard(config=None, log_path='./aerolog', window=1, divisor=10, span=30, format=None)``.

    `config` is a dict of the other arguments (Nebulae's first positional); dualtrain's
    keywords (``rank``, ``console``...) pass through `options`.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        log_path: str | os.PathLike[str] = "./aerolog",
        window: int = 1,
        divisor: int = 10,
        span: int = 30,
        format: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        given = from_config(config, "DashBoard", {"log_path": log_path, "window": window,
                            "divisor": divisor, "span": span, "format": format})  # fmt: skip
        if config is not None:
            unknown = sorted(set(config) - set(_KEYS) - {"rank"})
            if unknown:
                raise bad_argument("config", dict(config), f"keys among {_KEYS}; not {unknown}")
            rank = config.get("rank")
            if rank is not None and rank >= 0 and "rank" not in options:
                options["rank"] = rank  # Nebulae's config rank: who draws (-1: the launcher's)
        super().__init__(**given, **options)

    def gauge(  # type: ignore[override]
        self,
        entry: Mapping[str, Any],
        mile: int,
        epoch: int,
        mpe: int,
        stage: str,
        interval: int = 1,
        duration: float | None = None,
        flush: int = 0,
        is_global: bool = True,
        is_elastic: bool = False,
    ) -> None:
        """Notes step `mile` (0 .. mpe - 1) of `epoch` (from 0), as Nebulae's gauge.

        `flush`, `is_global` and `is_elastic` shaped Nebulae's text curve; dualtrain draws
        its own, so they are taken and change nothing.
        """
        mile, epoch = _count("mile", mile), _count("epoch", epoch)
        if isinstance(mpe, int) and not isinstance(mpe, bool) and mile >= mpe:
            raise bad_argument("mile", mile, f"a step in [0, mpe={mpe}) (Nebulae counts from 0)")
        super().gauge(entry, mile + 1, epoch + 1, mpe, stage, interval, duration)

    def read(self, entry: str, stage: str, epoch: int = -1) -> float | None:  # type: ignore[override]
        """`entry`'s mean over `stage`'s epoch `epoch` (from 1; -1: the latest); None off rank 0."""
        if self.rank > 0:
            return None
        if epoch == 0:
            raise ArgumentError("read's epoch counts from 1 (Nebulae's), or -1 for the latest")
        return super().read(entry, stage, epoch)

    def log(self, gauge: bool = True, tachograph: bool = True, history: str = "") -> list[Path]:
        """Writes the curves and CSVs into `log_path` (dualtrain's files, rank 0 only)."""
        if history:
            raise ArgumentError(
                "log(history=...) merged an earlier run's CSVs into Nebulae's curves; not "
                "built: dualtrain's DashBoard resumes through TimeMachine anchors' extra state"
            )
        return super().log(gauge, tachograph)
