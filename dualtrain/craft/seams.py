"""What the Craft core asks of an adapter: its ops table (``layers``) and ``realize`` (``craft``).

Each Protocol here is one seam between the core and ``dualtrain_torch`` / ``dualtrain_jax``:
`dualtrain.backends.load_part` returns the adapter's module typed as one of them, and
``tests/test_seams.py`` checks both adapters' modules against them, name for name and
signature for signature. Module-level names of the adapter play the members.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dualtrain.craft.craft import Craft

__all__ = ["CraftPart", "LayersPart"]


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
