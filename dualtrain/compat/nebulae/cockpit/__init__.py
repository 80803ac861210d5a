"""Nebulae's ``nebulae.cockpit``: ``Engine``, ``TimeMachine`` and ``Multiverse``."""

from __future__ import annotations

from dualtrain.compat.nebulae.cockpit.engine import Engine
from dualtrain.compat.nebulae.cockpit.multiverse_pt import Multiverse
from dualtrain.compat.nebulae.cockpit.time_machine import TimeMachine

__all__ = ["Engine", "Multiverse", "TimeMachine"]
