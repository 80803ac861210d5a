"""What the Craft core asks of an adapter: its ops table (``layers``) and ``realize`` (``craft``).

Each Protocol here is one seam between the core and ``dualtrain_torch`` / ``dualtrain_jax``:
`layers_part(name)` and `craft_part(name)` return the adapter's module typed as one, and
``tests/test_seams.py`` checks both adapters' modules against them, name for name and
signature for signature. Module-level names of the adapter play the members.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from dualtrain import backends

if TYPE_CHECKING:
    from dualtrain.craft.craft import Craft

__all__ = ["CraftPart", "LayersPart", "craft_part", "layers_part"]


class LayersPart(Protocol):
    """``dualtrain_<name>.layers``, read by `dualtrain.craft.ops`.

    Attributes:
        OPS: the functional ops by name (``"relu"``, ``"softmax"``, ...): the same names as
            the NumPy reference's table, `dualtrain.craft.reference.OPS`, each taking the
            same arguments as the `dualtrain.craft.ops` function of that name.
    """

    OPS: dict[str, Callable[..., Any]]


class CraftPart(Protocol):
    """``dualtrain_<name>.craft``, the framework half of a Craft (used by the demo)."""

    def realize(self, craft: Craft, *, seed: int = 0, device: Any = None, dtype: Any = None) -> Any:
        """The framework's module for `craft`, its parameters drawn from `seed`."""
        ...


def layers_part(name: str) -> LayersPart:
    """Backend `name`'s ``layers`` module (loads its framework)."""
    return backends.load_part(name, "layers")


def craft_part(name: str) -> CraftPart:
    """Backend `name`'s ``craft`` module (loads its framework)."""
    return backends.load_part(name, "craft")
