"""Pickling for the shared folder: framework arrays reduced the fast way their adapter knows.

`dumps` is what `dualtrain.preload.shared` writes an item with. Each framework's arrays go
through its adapter's ``pickle_reduce`` (the ``preload`` part), looked up once and only
once that framework is imported (its arrays cannot exist before).
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

from dualtrain.preload.seams import preload_part

__all__ = ["dumps"]


class _Pickler(pickle.Pickler):
    """Pickle, with each framework's arrays reduced the fast way its adapter knows.

    torch pickles a tensor through its own storage serialization (a 48 KiB tensor: 355 us a
    round trip, measured; 100 us as NumPy bytes); the torch adapter's `pickle_reduce` sends
    it as a NumPy array.
    """

    def reducer_override(self, obj: Any) -> Any:
        name = _FRAMEWORKS.get(type(obj).__module__.partition(".")[0])
        if name is not None and name in sys.modules:  # its arrays exist: it is imported
            reduce = _reducers.get(name)
            if reduce is None:
                reduce = _reducers[name] = preload_part(name).pickle_reduce
            reduced = reduce(obj)
            if reduced is not None:
                return reduced
        return NotImplemented


_FRAMEWORKS = {"torch": "torch", "jax": "jax", "jaxlib": "jax"}
_reducers: dict[str, Any] = {}


def dumps(item: Any) -> bytes:
    """`item` pickled (protocol 5), framework arrays the fast way (`_Pickler`)."""
    out = io.BytesIO()
    _Pickler(out, protocol=5).dump(item)
    return out.getvalue()
