"""The brochure's ``nebulae.astro.dock``: ``astrobase.dock`` (loads torch)."""

from __future__ import annotations

from dualtrain.compat.nebulae.astrobase.dock import *  # noqa: F403
from dualtrain.compat.nebulae.astrobase.dock import __all__ as __all__
