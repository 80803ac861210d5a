"""What the preloader asks of an adapter's ``preload`` module: pinned staging, fast pickles.

`preload_part(name)` returns the adapter's module typed as `PreloadPart`, and
``tests/test_seams.py`` checks both adapters against these signatures.
"""

from __future__ import annotations

from typing import Any, Protocol

from dualtrain import backends

__all__ = ["PreloadPart", "preload_part"]


class PreloadPart(Protocol):
    """``dualtrain_<name>.preload``, used by `dualtrain.preload.Preloader(pin_memory=...)`."""

    def pin(self, item: Any, /) -> Any:
        """`item` with its host arrays in page-locked memory when a CUDA device is present.

        The same values and structure; without CUDA the item itself, unchanged.
        """
        ...

    def pickle_reduce(self, obj: Any, /) -> tuple[Any, ...] | None:
        """A fast pickle reduction of one of this framework's arrays, or None for pickle's own.

        The shared cache pickles items for worker processes; the rebuilt array must equal
        `obj` in type, dtype, shape and values.
        """
        ...


def preload_part(name: str) -> PreloadPart:
    """Backend `name`'s ``preload`` module (loads its framework)."""
    return backends.load_part(name, "preload")
