"""The brochure's ``nebulae.astro.hangar``: ``astrobase.hangar``."""

from __future__ import annotations

from dualtrain.compat.nebulae.astrobase.hangar import __all__ as __all__, __getattr__ as __getattr__
