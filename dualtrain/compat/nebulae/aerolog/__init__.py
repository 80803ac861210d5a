"""Nebulae's ``nebulae.aerolog``: ``DashBoard`` and ``BluePrint``."""

from __future__ import annotations

from dualtrain.compat.nebulae.aerolog.blueprint import BluePrint
from dualtrain.compat.nebulae.aerolog.dashboard import DashBoard

__all__ = ["BluePrint", "DashBoard"]
