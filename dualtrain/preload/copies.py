"""The copies a cache hit returns, so a consumer changing its item never changes the cache."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from dualtrain.preload import kinds
from dualtrain.preload.sizes import copy_tensor

__all__ = ["fresh", "map_leaves"]


def fresh(item: Any) -> Any:
    """A copy of a cached item that shares no mutable memory with it, its types kept.

    NumPy arrays (an object array's objects too) and records (``np.void``), torch tensors
    (subclasses such as ``Parameter`` too), JAX arrays (a jitted step may donate, that is
    delete, the one it is given) and Pillow images (``PngImageFile`` too) are copied;
    lists, tuples (namedtuples too), dicts (subclasses too) and sets are rebuilt around
    fresh elements; str, bytes, numbers and other immutables come back as they are. Other
    objects are ``copy.deepcopy``-ed; one that refuses (raises) comes back as it is, the same
    object on every hit (changing it in place changes the cache).
    """
    return _fresh(item, {})


def _fresh(obj: Any, memo: dict[int, Any]) -> Any:
    if isinstance(obj, kinds.IMMUTABLE) and not isinstance(obj, np.void):
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, np.ndarray):
        out: Any = obj.copy()
        if obj.dtype == object:  # the copy holds the same objects: fresh ones instead
            memo[key] = out
            for index, x in np.ndenumerate(obj):
                out[index] = _fresh(x, memo)
    elif kinds.is_tensor(obj):
        out = copy_tensor(obj)
    elif kinds.is_jax(obj):
        # Immutable, but `jax.jit(..., donate_argnums=...)` deletes a donated buffer: the
        # cache must keep its own. `copy()` is a new buffer of the same sharding.
        out = obj.copy()
    elif isinstance(obj, np.void):  # a record views its array: changing it changes the cache
        out = obj.copy()
    elif kinds.is_image(obj):
        # `Image.copy` makes a plain Image (a PngImageFile would lose its type and `format`).
        plain = kinds.is_plain(obj, "PIL.Image", "Image")
        out = None if plain else kinds.safe_deepcopy(obj, memo, None)
        if type(out) is not type(obj):
            out = obj.copy()
    elif isinstance(obj, bytearray):
        out = bytearray(obj)
    elif isinstance(obj, (list, dict)):
        # The copy is known before its elements are made, so an element that refers back
        # to it (a cycle) gets the copy, not the cached original.
        out = copy.copy(obj)  # keeps the subclass (OrderedDict, defaultdict) and its extras
        memo[key] = out
        if isinstance(obj, list):
            out[:] = [_fresh(x, memo) for x in obj]
        else:
            for k, v in obj.items():
                out[k] = _fresh(v, memo)
    elif isinstance(obj, (tuple, set, frozenset)):
        out = kinds.rebuild(obj, lambda x: _fresh(x, memo), only_if_changed=False)
    else:
        out = kinds.safe_deepcopy(obj, memo, obj)
    memo[key] = out
    return out


def map_leaves(item: Any, fn: Callable[[Any], Any]) -> Any:
    """`item` with `fn` applied to everything that is not a list, tuple, dict or set.

    Containers are rebuilt (their types kept) only where an element changed. Each object
    is visited once: a leaf met twice gets one ``fn`` call (its result used at both
    places), and a container met again inside itself (a cycle) is left there as it is.
    """
    memo: dict[int, Any] = {}

    def each(obj: Any) -> Any:
        key = id(obj)
        if key in memo:
            return memo[key]
        if isinstance(obj, (list, tuple, dict, set, frozenset)):
            memo[key] = obj  # until it is done: a cycle back to it stops here
            out = kinds.rebuild(obj, each, only_if_changed=True)
        else:
            out = fn(obj)
        memo[key] = out
        return out

    return each(item)
