"""What Tank asks of an adapter's ``data`` module: a `Courier` that hands batches over.

`data_part(name)` returns the adapter's module typed as `DataPart`, and
``tests/test_seams.py`` checks both adapters against these signatures.
"""

from __future__ import annotations

from typing import Any, Protocol

from dualtrain import backends

__all__ = ["BatchCourier", "DataPart", "data_part"]


class BatchCourier(Protocol):
    """What ``Courier(device)`` gives: a callable from a NumPy batch to the framework's."""

    def __call__(self, batch: Any, /) -> Any:
        """`batch` (a tree of host arrays) as arrays of the framework on the device."""
        ...


class DataPart(Protocol):
    """``dualtrain_<name>.data``, used by `dualtrain.fuel.Tank` (``to="torch"`` or ``"jax"``)."""

    def Courier(self, device: Any = None) -> BatchCourier:  # noqa: N802 (the adapters' class)
        """A courier to `device` (None: the host, zero-copy; ``"cpu"`` is accepted too).

        Checks `device` now, so that a missing device fails before any file is read.
        """
        ...


def data_part(name: str) -> DataPart:
    """Backend `name`'s ``data`` module (loads its framework)."""
    return backends.load_part(name, "data")
