"""What an item costs in bytes, exactly, and the copies that keep a cache honest.

`own(item)` returns the item as the cache will hold it and the bytes it holds: an array that
is a small view of a larger buffer (a row of an in-memory table, a memory-mapped file) is
copied first, so a cached item never pins memory that it does not count. `fresh(item)` is
what a hit returns: arrays and tensors copied, containers rebuilt, so a consumer that
changes its item in place never changes the cache.

Counted exactly: NumPy arrays (their buffer; an object array's objects too), torch tensors
(their storage), JAX arrays (their buffers), Pillow images (pixel storage), bytes,
bytearray, str, numbers, and lists, tuples, sets and dicts of them (``sys.getsizeof`` of
each container plus its elements, each object once). Other objects count
``sys.getsizeof`` plus their ``__dict__`` and ``__slots__``; one with an ``nbytes``
attribute (CuPy) counts that too.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["fresh", "map_leaves", "nbytes", "own"]

# Pillow stores 1 byte per pixel for these modes, 2 for the 16-bit ones, 4 for the rest
# (RGB included: Pillow pads it to 4 bytes a pixel).
_PIL_ONE = frozenset({"1", "L", "P"})
_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), np.generic, range)
# A view spanning less than this share of its buffer is copied before it is cached.
_VIEW_SHARE = 0.5


def _framework(obj: object) -> str:
    root = type(obj).__module__.partition(".")[0]
    return root if root in ("torch", "jax", "jaxlib", "PIL") else ""


def _is_tensor(obj: object) -> bool:
    return _framework(obj) == "torch" and hasattr(obj, "untyped_storage")


def _is_jax(obj: object) -> bool:
    return _framework(obj) in ("jax", "jaxlib") and hasattr(obj, "nbytes")


def _is_image(obj: object) -> bool:
    return _framework(obj) == "PIL" and hasattr(obj, "getbands") and hasattr(obj, "size")


def _array_root(a: np.ndarray) -> Any:
    root: Any = a
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    return root


def _image_bytes(im: Any) -> int:
    width, height = im.size
    per_pixel = 1 if im.mode in _PIL_ONE else 2 if im.mode.startswith("I;16") else 4
    return width * height * per_pixel


def own(item: Any) -> Any:
    """`item` with every array that views a larger buffer replaced by a compact copy.

    Arrays and tensors that own their memory (or view most of it) are kept as they are;
    Pillow images are decoded (``load()``), so the cache holds pixels, not an open file.
    Containers are rebuilt only where an element changed.
    """
    return _own(item, {})


def _own(obj: Any, memo: dict[int, Any]) -> Any:
    key = id(obj)
    if key in memo:
        return memo[key]
    memo[key] = obj  # until it is done: an element that refers back to it (a cycle) stops here
    out = obj
    if isinstance(obj, np.ndarray):
        root = _array_root(obj)
        whole = root.nbytes if isinstance(root, np.ndarray) else -1
        if whole < 0 or obj.nbytes < _VIEW_SHARE * whole:
            out = np.array(obj, copy=True, subok=not isinstance(obj, np.memmap))
    elif _is_tensor(obj):
        if _strided(obj):
            storage = obj.untyped_storage().nbytes()
            if obj.nelement() * obj.element_size() < _VIEW_SHARE * storage:
                out = obj.detach().clone().requires_grad_(obj.requires_grad)
    elif _is_image(obj):
        obj.load()
    elif isinstance(obj, (list, tuple, dict, set, frozenset)):
        out = _rebuild(obj, lambda x: _own(x, memo), only_if_changed=True)
    memo[key] = out
    return out


def _strided(t: Any) -> bool:
    return str(t.layout) == "torch.strided"


def nbytes(item: Any, sizeof: Callable[[Any], int | None] | None = None) -> int:
    """Bytes `item` holds: its objects' ``sys.getsizeof`` plus every buffer, each once.

    Args:
        item: any object (see the module docstring for what is counted exactly).
        sizeof: optional ``sizeof(obj) -> int | None`` asked first for every object; an int
            is that object's whole size (its contents are not visited), None falls back to
            the rules above.
    """
    return _nbytes(item, sizeof, set(), set())


def _nbytes(
    obj: Any, sizeof: Callable[[Any], int | None] | None, seen: set[int], buffers: set[Any]
) -> int:
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if sizeof is not None:
        told = sizeof(obj)
        if told is not None:
            return int(told)
    if isinstance(obj, np.ndarray):
        root = _array_root(obj)
        head = sys.getsizeof(obj) - (obj.nbytes if obj.base is None else 0)
        if isinstance(root, np.ndarray):
            if id(root) in buffers:
                return head
            buffers.add(id(root))
            # An object array's buffer holds pointers: the objects it pins count too.
            held = _elements(root, sizeof, seen, buffers) if root.dtype == object else 0
            return head + root.nbytes + held
        # A buffer of another kind (bytes, mmap): its own size, through the buffer protocol.
        if id(root) in buffers:
            return head
        buffers.add(id(root))
        return head + (memoryview(root).nbytes if _has_buffer(root) else obj.nbytes)
    if _is_tensor(obj):
        head = sys.getsizeof(obj)
        if not _strided(obj):  # sparse and other layouts: their parts' bytes
            return head + _nbytes(_tensor_parts(obj), sizeof, seen, buffers)
        storage = obj.untyped_storage()
        ident = ("torch", storage.data_ptr(), str(storage.device))
        if ident in buffers and storage.nbytes() > 0:
            return head
        buffers.add(ident)
        return head + int(storage.nbytes())
    if _is_jax(obj):
        return sys.getsizeof(obj) + int(obj.nbytes)
    if _is_image(obj):
        return sys.getsizeof(obj) + _image_bytes(obj)
    size = sys.getsizeof(obj)
    if isinstance(obj, (_IMMUTABLE, bytearray, type)):
        return size
    if isinstance(obj, memoryview):
        return size + _nbytes(obj.obj, sizeof, seen, buffers)
    if isinstance(obj, dict):
        return size + sum(
            _nbytes(k, sizeof, seen, buffers) + _nbytes(v, sizeof, seen, buffers)
            for k, v in obj.items()
        )
    if isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(_nbytes(x, sizeof, seen, buffers) for x in obj)
        if isinstance(obj, tuple) and hasattr(obj, "__dict__"):  # a namedtuple subclass's
            size += _nbytes(vars(obj), sizeof, seen, buffers)
        return size
    extra = getattr(obj, "nbytes", None)
    if isinstance(extra, (int, np.integer)) and not isinstance(extra, bool):
        size += int(extra)
    if hasattr(obj, "__dict__"):
        size += _nbytes(vars(obj), sizeof, seen, buffers)
    for name in _slots(type(obj)):
        if hasattr(obj, name):
            size += _nbytes(getattr(obj, name), sizeof, seen, buffers)
    return size


def _elements(
    a: np.ndarray, sizeof: Callable[[Any], int | None] | None, seen: set[int], buffers: set[Any]
) -> int:
    return sum(_nbytes(x, sizeof, seen, buffers) for x in a.ravel(order="K"))


def _has_buffer(obj: Any) -> bool:
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _tensor_parts(t: Any) -> list[Any]:
    if str(t.layout) == "torch.sparse_coo":
        return [t._indices(), t._values()]
    parts = [getattr(t, name)() for name in ("crow_indices", "col_indices", "values")]
    return parts


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [n for n in names if n not in ("__dict__", "__weakref__")]


def fresh(item: Any) -> Any:
    """A copy of a cached item that shares no mutable memory with it.

    NumPy arrays (an object array's objects too), torch tensors and Pillow images are
    copied; lists, tuples (namedtuples too), dicts (subclasses too) and sets are rebuilt
    around fresh elements; JAX arrays, str, bytes and numbers are immutable and come back
    as they are. Other objects come back as they are (the same object on every hit).
    """
    return _fresh(item, {})


def _fresh(obj: Any, memo: dict[int, Any]) -> Any:
    if isinstance(obj, _IMMUTABLE) or _is_jax(obj):
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
    elif _is_tensor(obj):
        out = obj.detach().clone()
        if obj.requires_grad:
            out.requires_grad_(True)
    elif _is_image(obj):
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
        out = _rebuild(obj, lambda x: _fresh(x, memo), only_if_changed=False)
    else:
        out = obj
    memo[key] = out
    return out


def _rebuild(obj: Any, each: Callable[[Any], Any], *, only_if_changed: bool) -> Any:
    """`obj` (a list, tuple, dict or set, subclasses included) with `each` of its elements."""
    if isinstance(obj, dict):
        values = {k: each(v) for k, v in obj.items()}
        if only_if_changed and all(values[k] is obj[k] for k in obj):
            return obj
        out = copy.copy(obj)  # keeps the subclass (OrderedDict, defaultdict) and its extras
        for k, v in values.items():
            out[k] = v
        return out
    items = [each(x) for x in obj]
    if only_if_changed and all(a is b for a, b in zip(items, obj, strict=True)):
        return obj
    if isinstance(obj, tuple):
        return obj._make(items) if hasattr(obj, "_make") else type(obj)(items)
    if isinstance(obj, list):
        out_list = copy.copy(obj)
        out_list[:] = items
        return out_list
    return type(obj)(items)


def map_leaves(item: Any, fn: Callable[[Any], Any]) -> Any:
    """`item` with `fn` applied to everything that is not a list, tuple, dict or set.

    Containers are rebuilt (their types kept) only where an element changed.
    """

    def each(obj: Any) -> Any:
        if isinstance(obj, (list, tuple, dict, set, frozenset)):
            return _rebuild(obj, each, only_if_changed=True)
        return fn(obj)

    return each(item)
