"""nebulgym's ``NebulDataset(input_data, preloaded_data=20, max_memory_size=None)``.

It is a `dualtrain.Preloader` over `input_data` (and a torch ``Dataset``): items are cached
in memory within ``max_memory_size`` bytes, where nebulgym wrote every item to a temporary
folder with ``torch.save`` in the first epoch and read it back with one thread per item
(never evicting: its budget was not enforced). The order of use reaches the cache through
``dataset.sampler(...)`` or ``expect(...)``; without one, a DataLoader batch's missing items
load in parallel. nebulgym's ``WindowLoader`` (the cache inside) raises `RetiredError`.
"""

from __future__ import annotations

from typing import Any

from dualtrain.compat.retired import retire
from dualtrain.errors import bad_argument
from dualtrain.preload import Preloader
from dualtrain_torch.compat.nebulgym.data.base import BaseDataset

__all__ = ["NebulDataset"]

_RETIRED = {
    "WindowLoader": "it was NebulDataset's disk cache; dualtrain's cache is "
    "dualtrain.Preloader(source, max_memory_size, preloaded_data): items in memory within "
    "the budget, its counters in .stats(), the order of use given by .sampler() or .expect()",
}


def __getattr__(name: str) -> Any:
    retire(__name__, name, _RETIRED)


class NebulDataset(Preloader, BaseDataset):
    """`input_data`'s items, cached in memory within a budget and loaded ahead.

    Args:
        input_data: the dataset (anything with ``__getitem__`` and ``__len__``).
        preloaded_data: items of the known order loaded ahead (nebulgym's window).
        max_memory_size: the budget in bytes; None: a quarter of the memory available now
            (nebulgym's default too).
        **options: `dualtrain.Preloader`'s keywords (order, threads, copy, sizeof,
            pin_memory).

    Items come back as `input_data` gives them; attributes the dataset has are read through
    (``dataset.classes``), which nebulgym lost.
    """

    def __init__(
        self,
        input_data: Any,
        preloaded_data: int = 20,
        max_memory_size: int | None = None,
        **options: Any,
    ) -> None:
        if not (hasattr(input_data, "__getitem__") and hasattr(input_data, "__len__")):
            raise bad_argument(
                "input_data", type(input_data).__name__, "a dataset (__getitem__ and __len__)"
            )
        Preloader.__init__(self, input_data, max_memory_size, preloaded_data, **options)
        BaseDataset.__init__(self, input_data)  # nebulgym's subclasses read self._data
