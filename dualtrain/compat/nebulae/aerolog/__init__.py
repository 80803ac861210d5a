"""Nebulae's ``nebulae.aerolog``: ``DashBoard`` and ``BluePrint`` (``CtrlPanel`` is retired)."""

from __future__ import annotations

from typing import NoReturn

from dualtrain.compat.nebulae.aerolog.blueprint import BluePrint
from dualtrain.compat.nebulae.aerolog.dashboard import DashBoard
from dualtrain.compat.retired import retire

__all__ = ["BluePrint", "DashBoard"]


def __getattr__(name: str) -> NoReturn:
    retire(
        __name__,
        name,
        {
            "CtrlPanel": "Nebulae's keyboard control panel is not carried over; DashBoard "
            "draws its live view itself (rich, on a terminal), and a run is stopped with Ctrl-C"
        },
    )
