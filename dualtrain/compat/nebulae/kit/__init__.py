"""The brochure's ``nebulae.kit``: the same names as ``toolkit``."""

from __future__ import annotations

from dualtrain.compat.nebulae.toolkit import GPUtil, Timer, autoPad, destine

__all__ = ["GPUtil", "Timer", "autoPad", "destine"]
