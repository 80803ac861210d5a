"""Preloader: any indexable dataset, its items cached within a byte budget and loaded ahead.

`Preloader(source)` is a dataset again (``__getitem__``, ``__len__``, ``__getitems__`` for
torch's DataLoader batches), so it goes wherever `source` went. The order of use reaches it
three ways, and only these (it never guesses index+1, +2, ...): ``order=`` (one epoch's
order, repeated), a sampler wrapped by `sampler()` (each epoch's order as the DataLoader
draws it), or `expect(keys)`. Without one it caches, and loads each DataLoader batch's
missing items in parallel.
"""

from __future__ import annotations

import copy as copying
import functools
import operator
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.preload.cache import PreloadCache
from dualtrain.preload.samplers import EpochOrder, PlannedSampler
from dualtrain.preload.seams import preload_part
from dualtrain.validate import check_seed

__all__ = ["NebulDataset", "PlannedSampler", "Preloader", "index_key", "pinning"]

# The key of an index the cache cannot hold (a slice, a list): served by the source directly.
_UNCACHED = object()
# The Preloader's own attributes, never looked up on the source (unset while unpickling).
_OWN = ("source", "_source", "cache", "_settings", "_plan", "_replan")


def index_key(index: Any, length: int) -> Any:
    """The cache key of ``dataset[index]``.

    An int in [0, length) for int-like indices (NumPy and 0-d torch ints included, negative
    ones counted from the end); a str or bytes as itself; a tuple of keys as the tuple of
    their keys; any other hashable tagged with its type, so a key that merely equals an
    int never hits that int's entry (``p[1.0]`` is ``source[1.0]``, not the cached
    ``source[1]``); `_UNCACHED` for the rest: slices, lists, ``...``, None, bools and arrays
    or tensors of indices, which select something other than one item.
    """
    if getattr(index, "ndim", 0) != 0 or _is_bool(index):
        return _UNCACHED  # a mask or an index array: a[True] is not a[1], a[t([3])] not a[3]
    try:
        i = operator.index(index)
    except TypeError:
        return _plain_key(index)
    return i + length if -length <= i < 0 else i


def _is_bool(index: Any) -> bool:
    return isinstance(index, bool) or "bool" in str(getattr(index, "dtype", ""))


def _plain_key(key: Any) -> Any:
    """`key` as a cache key (its ints as ints), or `_UNCACHED`."""
    if key is None or key is Ellipsis or isinstance(key, slice):
        return _UNCACHED  # hashable on Python 3.12+, yet they select several items
    if type(key) is tuple:
        parts = []
        for part in key:
            if getattr(part, "ndim", 0) != 0 or _is_bool(part):
                return _UNCACHED
            try:
                parts.append(operator.index(part))
            except TypeError:
                part = _plain_key(part)
                if part is _UNCACHED:
                    return _UNCACHED
                parts.append(part)
        return tuple(parts)
    if hasattr(key, "ndim") and not isinstance(key, np.generic):
        return _UNCACHED  # a tensor hashes by identity: every call would be a new key
    try:
        hash(key)
    except TypeError:
        return _UNCACHED
    if type(key) in (str, bytes):
        return key  # equal only to a str (bytes): never to an int, a tuple or a _Typed
    # 1.0, Decimal(1), np.float64(1) equal 1 as dict keys, yet a source may serve them
    # differently (a list refuses them): tagged with their type, they get entries of their own.
    return _Typed(key)


class _Typed:
    """A key that is not an int, str, bytes or tuple: equal only to one of the same type."""

    __slots__ = ("index", "kind")

    def __init__(self, index: Hashable) -> None:
        self.index, self.kind = index, type(index)

    def __eq__(self, other: object) -> bool:
        if type(other) is not _Typed or self.kind is not other.kind:
            return False
        return self.index is other.index or bool(self.index == other.index)  # as dict keys

    def __hash__(self) -> int:
        return hash((_Typed, self.kind, self.index))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Typed, (self.index,))

    def __repr__(self) -> str:
        return repr(self.index)  # as the load error's note names the item


def _index_of(key: Any) -> Any:
    """The index `key` was made from (ints as ints)."""
    if type(key) is _Typed:
        return key.index
    if type(key) is tuple:
        return tuple(_index_of(part) for part in key)
    return key


def _load(source: Any, key: Any) -> Any:
    """``source[index]`` for the cache `key` of that index."""
    return source[_index_of(key)]


def pinning(pin_memory: bool | str) -> Callable[[Any], Any] | None:
    """The ``pin(item)`` of `pin_memory` (None: no pinning).

    False: none; "torch" or "jax": that adapter's; True: the framework already imported
    (torch first), none when neither is.
    """
    if pin_memory is False:
        return None
    if pin_memory is True:
        pin_memory = "torch" if "torch" in sys.modules else "jax" if "jax" in sys.modules else ""
        if not pin_memory:
            return None  # neither framework is in use: nothing to pin for
    if pin_memory not in ("torch", "jax"):
        raise bad_argument("pin_memory", pin_memory, "a bool, 'torch' or 'jax'")
    pin: Callable[[Any], Any] = preload_part(pin_memory).pin
    return pin


class Preloader:
    """`source`'s items, cached within `max_memory_size` bytes and loaded ahead in order.

    Args:
        source: anything with ``__getitem__`` and ``__len__`` (a torch Dataset, a list, a
            Tank's pack column, a user's class); ``source[i]`` must give the same item each
            time (random augmentation belongs after the cache).
        max_memory_size: the budget in bytes; None: a quarter of the memory available now
            (`dualtrain.preload.budget.DEFAULT_FRACTION`). Held bytes never exceed it.
        preloaded_data: how many items of the known order are loaded ahead (nebulgym's name).
        order: one epoch's order of indices, followed every epoch; None: see `sampler()`.
        threads: loader threads; None: ``min(preloaded_data, os.cpu_count())``.
        copy: hits return copies (arrays, tensors, images; containers rebuilt), so an item
            changed in place never changes the cache; False returns the held object.
        sizeof: ``sizeof(obj) -> int | None`` for objects the byte count cannot see into.
        pin_memory: pin held tensors and arrays for fast copies to a CUDA device: "torch",
            "jax", True (the framework in use) or False; nothing happens without CUDA.

    Items come back as the source gave them (same types and values). ``stats()`` says what
    the cache did; under DataLoader workers (fork or spawn) the items are shared through
    one folder in memory, within the same budget (`dualtrain.preload.shared`). A copy
    (``copy.copy``, ``copy.deepcopy``) gets an empty cache of its own with the same
    settings; pickling, which is how worker processes get it, joins this one's.
    """

    def __init__(
        self,
        source: Any,
        max_memory_size: int | None = None,
        preloaded_data: int = 20,
        order: Iterable[Any] | None = None,
        *,
        threads: int | None = None,
        copy: bool = True,
        sizeof: Callable[[Any], int | None] | None = None,
        pin_memory: bool | str = False,
        _shared_path: str | None = None,
    ) -> None:
        if not (hasattr(source, "__getitem__") and hasattr(source, "__len__")):
            raise bad_argument("source", source, "an object with __getitem__ and __len__")
        plan = None
        if order is not None:
            if isinstance(order, (str, bytes)) or not isinstance(order, Iterable):
                raise bad_argument("order", order, "an iterable of indices, or None")
            plan = [index_key(i, len(source)) for i in order]
            if any(k is _UNCACHED for k in plan):
                raise bad_argument("order", order, "indices (ints or hashable keys)")
        self._source = source
        pin = pinning(pin_memory)
        self.cache = PreloadCache(
            functools.partial(_load, source), max_memory_size=max_memory_size,
            preloaded_data=preloaded_data, threads=threads, copy=copy, sizeof=sizeof,
            pin=pin, shared_path=_shared_path,
        )  # fmt: skip
        # What a copy's own cache is made with: the budget and thread count as resolved here.
        self._settings: dict[str, Any] = {
            "max_memory_size": self.cache.max_memory_size, "threads": self.cache.threads,
            "preloaded_data": self.cache.preloaded_data, "copy": copy, "sizeof": sizeof,
            "pin": pin,
        }  # fmt: skip
        self._plan = plan
        self._replan = False  # a copy's cache gets the order at its first item (_own_cache)
        if plan:
            self.cache.expect(plan, cyclic=True)

    @property
    def source(self) -> Any:
        """The wrapped dataset; setting another gives a new, empty cache over it."""
        return self._source

    @source.setter
    def source(self, source: Any) -> None:
        if not (hasattr(source, "__getitem__") and hasattr(source, "__len__")):
            raise bad_argument("source", source, "an object with __getitem__ and __len__")
        # The held items are the old source's (the old cache may be a copy's too: left as is).
        self._source = source
        self._own_cache()

    def __copy__(self) -> Preloader:
        """A copy over the same source with a cache of its own.

        Sharing the cache would serve this Preloader's items to a copy given another source.
        """
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._own_cache()
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> Preloader:
        """A copy over a deep copy of the source with a fresh cache, sharing nothing.

        The default deep copy went through the cache's pickling, which joins the original's
        shared folder: a copy whose source was then changed (``val.source.split = "val"``)
        and the original's DataLoader workers served each other's items. Pickling (worker
        processes) still joins it, as it should.
        """
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        state = {k: v for k, v in self.__dict__.items() if k != "cache"}
        new.__dict__.update(copying.deepcopy(state, memo))
        new._own_cache()
        return new

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for a worker process, which loads nothing ahead: the order stays here
        # (an epoch's keys, pickled once per worker otherwise).
        return {**self.__dict__, "_plan": None, "_replan": False}

    def _own_cache(self) -> None:
        """Gives this Preloader a new, empty cache over its source.

        Its order (``order=``) is handed on at the first item asked for, not now: loading
        ahead at once would read the source before ``val.source.split = "val"`` changes it.
        """
        self.cache = PreloadCache(functools.partial(_load, self._source), **self._settings)
        self._replan = bool(self._plan)

    def _start_plan(self) -> None:
        self._replan = False
        self.cache.expect(self._plan or (), cyclic=True)

    @property
    def max_memory_size(self) -> int:
        """The budget in bytes."""
        return self.cache.max_memory_size

    @property
    def preloaded_data(self) -> int:
        return self.cache.preloaded_data

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: Any) -> Any:
        if self._replan:
            self._start_plan()
        key = index_key(index, len(self._source))
        if key is _UNCACHED:
            return self._source[index]
        return self.cache.get(key)

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        """The items of `indices` (torch's DataLoader asks a batch at once through this)."""
        if self._replan:
            self._start_plan()
        n = len(self._source)
        keys = [index_key(i, n) for i in indices]
        if any(k is _UNCACHED for k in keys):
            return [self[i] for i in indices]
        return self.cache.get_many(keys)

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def expect(self, indices: Iterable[Any]) -> None:
        """Says the next items asked for are `indices`, in this order; loads them ahead."""
        self._replan = False  # this order replaces ``order=``
        n = len(self._source)
        keys = (index_key(i, n) for i in indices)
        # A slice or index array in a plan is served by the source: nothing to load ahead.
        self.cache.expect(k for k in keys if k is not _UNCACHED)

    def sampler(
        self, sampler: Iterable[Any] | None = None, *, shuffle: bool = False, seed: int = 0
    ) -> PlannedSampler:
        """A sampler whose every epoch's order this Preloader loads ahead.

        Args:
            sampler: a sampler to follow (torch's RandomSampler, a DistributedSampler, any
                iterable of indices or of index lists); None: this Preloader's own, in order
                or shuffled per (seed, epoch) by dualtrain's streams.
            shuffle: the own sampler shuffles each epoch (not with `sampler`).
            seed: the own sampler's seed.

        Pass it as ``DataLoader(preloader, batch_size=..., sampler=preloader.sampler(...))``.
        """
        if sampler is not None and shuffle:
            raise bad_argument("shuffle", shuffle, "False when a sampler is given")
        if sampler is None:
            sampler = EpochOrder(len(self), bool(shuffle), check_seed("seed", seed))
        elif not isinstance(sampler, Iterable):
            raise bad_argument("sampler", sampler, "an iterable of indices (a sampler)")
        return PlannedSampler(self, sampler)

    def stats(self) -> dict[str, Any]:
        """The cache's counters and bytes (`PreloadCache.stats`)."""
        return self.cache.stats()

    def clear(self) -> None:
        """Drops the held items."""
        self.cache.clear()

    def close(self) -> None:
        """Stops the loader threads; held items stay."""
        self.cache.close()

    def __getattr__(self, name: str) -> Any:
        # The source's own methods and attributes stay reachable (nebulgym lost them).
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self._source, name)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.source!r}, max_memory_size={self.max_memory_size}, "
            f"preloaded_data={self.preloaded_data})"
        )


class NebulDataset(Preloader):
    """nebulgym's spelling: ``NebulDataset(input_data, preloaded_data, max_memory_size)``.

    `input_data` is the dataset; the rest is `Preloader`'s (same keywords after these).
    """

    def __init__(
        self,
        input_data: Any,
        preloaded_data: int = 20,
        max_memory_size: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(input_data, max_memory_size, preloaded_data, **options)
