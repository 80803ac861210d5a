"""Nebulae's ``nebulae.law``: ``Constant``, and ``Multiverse`` as its demos spell it.

v0.5.15's code kept Multiverse in ``cockpit``; its demo_dist calls ``neb.law.Multiverse``.
Both spellings name the same class.
"""

from __future__ import annotations

from dualtrain.compat.nebulae.cockpit.multiverse_pt import Multiverse
from dualtrain.compat.nebulae.law.constant import Constant

__all__ = ["Constant", "Multiverse"]
