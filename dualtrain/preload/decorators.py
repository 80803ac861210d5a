"""nebulgym's class decorators: ``@accelerate_dataset(...)`` and its older name ``@patch_dataset``.

Decorating a dataset class gives every instance its own `Preloader` over the class's own
``__getitem__``. The instance stays what it was (nebulgym returned another object): the
same class, its own methods and attributes, and it pickles (DataLoader's spawn workers) with
its cache shared through memory, not copied. ``instance.preloader`` is the Preloader:
``stats()``, ``sampler()``, ``expect()``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.preload.budget import check_budget
from dualtrain.preload.preloader import Preloader

__all__ = ["accelerate_dataset", "patch_dataset"]

T = TypeVar("T", bound=type)

_MARK = "__dualtrain_preload__"  # the class attribute holding the decorator's settings
_SLOT = "_dualtrain_preload_slot"  # the instance attribute holding its Preloader
# The class attribute holding the decorated class's own __getitem__: looked up on an
# instance's class, it is that of the most derived decorated class, the one its cache serves.
_GETITEM = "__dualtrain_preload_getitem__"
# The decorator's __getitem__ wrappers (by identity: functools.wraps copies attributes).
_WRAPPERS: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
_OPTIONS = ("threads", "copy", "sizeof", "pin_memory")


def accelerate_dataset(
    cls: T | None = None,
    /,
    *,
    preloaded_data: int = 20,
    max_memory_size: int | None = None,
    **options: Any,
) -> Any:
    """Class decorator: the class's instances cache their items and load them ahead.

    ``@accelerate_dataset()`` and ``@accelerate_dataset`` both work.

    Args:
        cls: the dataset class (given when used without parentheses).
        preloaded_data: items of the known order loaded ahead (`Preloader`).
        max_memory_size: the budget in bytes per instance; None: a quarter of the memory
            available when the instance is made.
        **options: `Preloader`'s keywords: threads, copy, sizeof, pin_memory.

    The class must define ``__getitem__`` and ``__len__``. An instance's order of use reaches
    its cache through ``instance.preloader.sampler(...)`` or ``expect(...)``; without one
    it caches, and loads a DataLoader batch's missing items in parallel.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise bad_argument("options", unknown, f"Preloader keywords among {_OPTIONS}")
    if max_memory_size is not None:
        check_budget(max_memory_size)
    settings = {"preloaded_data": preloaded_data, "max_memory_size": max_memory_size, **options}
    # Checks the settings now (at decoration), not at the first item.
    Preloader([], **settings).close()

    def decorate(klass: T) -> T:
        return _decorate(klass, settings)

    if cls is not None:
        return decorate(cls)
    return decorate


patch_dataset = accelerate_dataset  # nebulgym's name before 2022-06-07 (its technical README)


def _decorate(cls: T, settings: dict[str, Any]) -> T:
    if not isinstance(cls, type):
        raise bad_argument("cls", cls, "a dataset class (use @accelerate_dataset(...) on one)")
    for name in ("__getitem__", "__len__"):
        if not callable(getattr(cls, name, None)):
            raise bad_argument("cls", cls, f"a class defining {name}")
    if "preloader" in dir(cls) and _MARK not in dir(cls):
        raise ArgumentError(
            f"cls: {cls.__name__} already has an attribute 'preloader', which the decorator "
            "adds; rename it"
        )
    already = _MARK in cls.__dict__
    setattr(cls, _MARK, dict(settings))
    if already:
        return cls  # decorated again: new settings for new instances, nothing wrapped twice
    original_init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    original_getitem: Callable[..., Any] = getattr(cls, "__getitem__")  # noqa: B009
    setattr(cls, _GETITEM, original_getitem)

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        original_init(self, *args, **kwargs)
        # Made now, so a DataLoader forking its workers before the first item shares it.
        _preloader(self)

    @functools.wraps(original_getitem)
    def __getitem__(self: Any, index: Any) -> Any:  # noqa: N807
        if getattr(type(self), _GETITEM) is not original_getitem:
            # A decorated subclass's __getitem__ called this one (super()): its cache holds
            # the subclass's items, so this class's item is computed, not cached again.
            return original_getitem(self, index)
        return _preloader(self)[index]

    def __getitems__(self: Any, indices: Any) -> list[Any]:  # noqa: N807
        getitem = type(self).__getitem__
        if getitem in _WRAPPERS:
            # A decorated class's wrapper: its cache serves exactly what it would.
            return _preloader(self).__getitems__(indices)
        # An undecorated subclass overrode __getitem__: torch's DataLoader calls this
        # __getitems__ for it, and must get the subclass's items (each through its own
        # __getitem__, whose super() call still reaches the cache).
        return [getitem(self, i) for i in indices]

    def preloader(self: Any) -> Preloader:
        """This instance's Preloader (its cache, `stats()`, `sampler()`)."""
        return _preloader(self)

    _WRAPPERS.add(__getitem__)
    cls.__init__ = __init__  # type: ignore[misc]
    setattr(cls, "__getitem__", __getitem__)  # noqa: B010
    if "__getitems__" not in dir(cls):
        setattr(cls, "__getitems__", __getitems__)  # noqa: B010
    setattr(cls, "preloader", property(preloader))  # noqa: B010
    return cls


class _Source:
    """The instance seen through its class's own ``__getitem__`` (the cache's source)."""

    def __init__(self, owner: Any, getitem: Callable[..., Any]) -> None:
        self.owner, self.getitem = owner, getitem

    def __getitem__(self, index: Any) -> Any:
        return self.getitem(self.owner, index)

    def __len__(self) -> int:
        return len(self.owner)


class _Slot:
    """Holds an instance's Preloader; pickles as its settings and shared folder only.

    A pickled instance (a DataLoader's spawned worker) joins the original's shared cache; a
    deep copy gets a cache of its own (a copy may change what its items are), and so does a
    shallow copy (its dict still holds the original's slot, see `serves`).
    """

    def __init__(self, settings: dict[str, Any], shared_path: str | None = None) -> None:
        self.settings, self.shared_path = settings, shared_path
        self.preloader: Preloader | None = None

    def get(self, owner: Any, getitem: Callable[..., Any]) -> Preloader:
        if self.preloader is None:
            # Unpickled in a worker (shared_path set): it joins the owner's shared cache.
            self.preloader = Preloader(
                _Source(owner, getitem), **self.settings, _shared_path=self.shared_path
            )
        return self.preloader

    def serves(self, owner: Any) -> bool:
        """Whether this slot's Preloader (if made) reads `owner`'s items, not another's."""
        return self.preloader is None or self.preloader.source.owner is owner

    def __deepcopy__(self, memo: dict[int, Any]) -> _Slot:
        return _Slot(dict(self.settings))

    def __reduce__(self) -> tuple[Any, ...]:
        path = self.shared_path
        if self.preloader is not None:
            path = self.preloader.cache.__getstate__()["shared_path"]
        return (_Slot, (self.settings, path))


def _preloader(owner: Any) -> Preloader:
    try:
        slot = owner.__dict__.get(_SLOT)
    except AttributeError:
        raise ArgumentError(
            f"{type(owner).__name__} instances have no __dict__ (__slots__); "
            "wrap an instance with Preloader(instance) instead of decorating the class"
        ) from None
    if slot is None or not slot.serves(owner):  # new, or a shallow copy's: its own cache
        slot = _Slot(getattr(type(owner), _MARK))
        owner.__dict__[_SLOT] = slot
    preloader: Preloader = slot.get(owner, getattr(type(owner), _GETITEM))
    return preloader
