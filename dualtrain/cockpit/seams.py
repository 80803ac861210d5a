"""What the cockpit asks of an adapter's ``cockpit`` module: its devices for CUDA numbers.

`cockpit_part(name)` returns the adapter's module typed as `CockpitPart`, and
``tests/test_seams.py`` checks both adapters against these signatures.
"""

from __future__ import annotations

from typing import Any, Protocol

from dualtrain import backends

__all__ = ["CockpitPart", "cockpit_part"]


class CockpitPart(Protocol):
    """``dualtrain_<name>.cockpit``, used by `dualtrain.cockpit.Engine`."""

    def devices(self, ordinals: tuple[int, ...], /) -> list[Any]:
        """This framework's devices for CUDA numbers `ordinals`, in that order.

        ``()`` gives ``[the CPU device]``. An ordinal this process has no device for is an
        ArgumentError naming it.
        """
        ...


def cockpit_part(name: str) -> CockpitPart:
    """Backend `name`'s ``cockpit`` module (loads its framework)."""
    return backends.load_part(name, "cockpit")
