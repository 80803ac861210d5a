"""The cockpit under torch: CUDA numbers as ``torch.device``s.

The JAX adapter's ``cockpit`` module has the same names (`dualtrain.cockpit.seams`).
"""

from __future__ import annotations

import torch

from dualtrain.errors import bad_argument

__all__ = ["devices"]


def devices(ordinals: tuple[int, ...], /) -> list[torch.device]:
    """``cuda:<n>`` for each ordinal (checked against ``torch.cuda.device_count()``)."""
    if not ordinals:
        return [torch.device("cpu")]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bad = [n for n in ordinals if not 0 <= n < count]
    if bad:
        raise bad_argument("ordinals", tuple(ordinals), f"CUDA numbers below {count} (torch)")
    return [torch.device("cuda", n) for n in ordinals]
