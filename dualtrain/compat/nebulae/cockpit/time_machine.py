"""Nebulae's ``nebulae.cockpit.TimeMachine``: dualtrain's anchors, Nebulae's arguments."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dualtrain.checkpoint.time_machine import TimeMachine as _TimeMachine
from dualtrain.compat.nebulae.config import from_config
from dualtrain.craft.craft import Craft
from dualtrain.multiverse.world import from_environment

__all__ = ["TimeMachine"]


def _module(craft: Any) -> Any:
    # a Nebulae Craft (astrobase.dock.Craft) anchors its realized module
    return craft.module() if isinstance(craft, Craft) and hasattr(craft, "module") else craft


def _optimizer(optz: Any) -> Any:
    return getattr(optz, "optz", optz)  # dock.Momentum & co hold a torch optimizer


class TimeMachine(_TimeMachine):
    """``TimeMachine(config=None, ckpt_path=None, save_path=None, max_anchors=-1)``.

    ``drop(craft, optz=None, file='', save_scope=None, frozen=False)`` and ``to(craft,
    optz=None, file='', ckpt_scope=None, frozen=False)`` take Nebulae's order; the anchors
    are dualtrain's (atomic, checked; see docs/checkpoints.md). Under several processes
    only rank 0 drops, as in Nebulae.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        ckpt_path: str | os.PathLike[str] | None = None,
        save_path: str | os.PathLike[str] | None = None,
        max_anchors: int = -1,
    ) -> None:
        given = {"ckpt_path": ckpt_path, "save_path": save_path, "max_anchors": max_anchors}
        super().__init__(**from_config(config, "TimeMachine", given))

    def drop(  # type: ignore[override]
        self,
        craft: Any,
        optz: Any = None,
        file: str | os.PathLike[str] = "",
        save_scope: str | None = None,
        frozen: bool = False,
    ) -> Path | None:
        """Writes an anchor (rank 0 only; others return None). `frozen` is unused, as in Nebulae."""
        world = from_environment()
        if world is not None and world.rank > 0:
            return None
        return super().drop(_module(craft), file, save_scope, optimizer=_optimizer(optz))

    def to(  # type: ignore[override]
        self,
        craft: Any,
        optz: Any = None,
        file: str | os.PathLike[str] = "",
        ckpt_scope: str | None = None,
        frozen: bool = False,
    ) -> Any:
        """Loads the anchor `file` (default: the latest) into `craft`; strict when `frozen`."""
        return super().to(_module(craft), file, ckpt_scope, frozen, optimizer=_optimizer(optz))
