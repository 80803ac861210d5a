"""What an item costs in bytes, exactly, and the copies that keep a cache honest.

`nbytes(item)` counts, each object and each buffer once: ``sys.getsizeof`` of every object
plus the buffers it holds. NumPy arrays count their ROOT buffer (a view counts the whole
array it pins; an object array counts its objects too; an array viewing a torch tensor
counts that tensor's storage). A structured record (``np.void``) that views an array counts
that array's buffer the same way. Torch tensors count their storage (for a tensor that
borrows memory, e.g. ``torch.from_numpy(row)``, the storage is the borrowed part only:
`own` copies such tensors, so what the cache holds is what it counted). JAX arrays count
the bytes of their shards held by this process (a copy replicated over four devices counts
four times). Pillow images count their pixels (1, 2 or 4 bytes each); bytes, bytearray, str
and numbers count ``sys.getsizeof``; lists, tuples, sets and dicts count themselves plus
their elements. Other objects count ``sys.getsizeof`` plus their ``__dict__`` and
``__slots__``; one with an integer ``nbytes`` attribute (CuPy) counts that too.

`own(item)` is the item as a cache holds it: views of larger buffers and borrowed storages
replaced by compact copies (`own` says which). What a hit returns is `copies.fresh`.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from dualtrain.errors import ArgumentError
from dualtrain.preload import kinds

__all__ = ["checked_size", "copy_tensor", "nbytes", "own"]

# Pillow stores 1 byte per pixel for these modes, 2 for the 16-bit ones, 4 for the rest
# (RGB included: Pillow pads it to 4 bytes a pixel).
_PIL_ONE = frozenset({"1", "L", "P"})
# A view spanning less than this share of its buffer is copied before it is cached.
_VIEW_SHARE = 0.5


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
    """`item` with every array that pins memory it does not count replaced by a compact copy.

    Copied: NumPy arrays and records viewing less than half of their root array or memory
    that NumPy does not own (bytes, mmap, a torch tensor), and torch tensors whose storage
    is borrowed (``untyped_storage().resizable()`` is False: from NumPy, DLPack, a file
    mapping) or less than half used. Arrays and tensors that own their memory (or view most
    of it) are kept as they are; Pillow images are decoded (``load()``), so the cache holds
    pixels, not an open file. Containers are rebuilt only where an element changed.
    """
    return _own(item, {})


def _own(obj: Any, memo: dict[int, Any]) -> Any:
    key = id(obj)
    if key in memo:
        return memo[key]
    memo[key] = obj  # until it is done: an element that refers back to it (a cycle) stops here
    out = obj
    if isinstance(obj, np.ndarray):
        if _pins(obj):
            out = np.array(obj, copy=True, subok=not isinstance(obj, np.memmap))
    elif isinstance(obj, np.void):
        if _record_base(obj) is not None and _pins(obj):
            out = obj.copy()
    elif kinds.is_tensor(obj):
        if _strided(obj):
            storage = obj.untyped_storage()
            # A storage that is not resizable borrows its memory (a NumPy array, a DLPack
            # capsule, a mapped file): it keeps alive more than its nbytes say.
            used = obj.nelement() * obj.element_size()
            if not storage.resizable() or used < _VIEW_SHARE * storage.nbytes():
                out = copy_tensor(obj)
    elif kinds.is_image(obj):
        obj.load()
    elif isinstance(obj, (list, tuple, dict, set, frozenset)):
        out = kinds.rebuild(obj, lambda x: _own(x, memo), only_if_changed=True)
    memo[key] = out
    return out


def _record_base(v: np.void) -> Any:
    # NumPy's stubs say a scalar's base is None: a record's is the array it views.
    return getattr(v, "base", None)


def _pins(a: np.ndarray | np.void) -> bool:
    """Whether `a` (an array or a record) views memory that it would not count as its own."""
    base = _record_base(a) if isinstance(a, np.void) else a.base
    root = a if base is None else _array_root(base)
    if not isinstance(root, np.ndarray) or not root.flags.owndata:
        return True  # bytes, mmap, a torch tensor, memory lent by a C extension
    return a.nbytes < _VIEW_SHARE * root.nbytes


def copy_tensor(t: Any) -> Any:
    """A compact copy of tensor `t` of its own type, in memory of its own, gradients kept."""
    if not kinds.is_plain(t, "torch", "Tensor"):
        # A subclass torch's ops do not keep (Parameter): its own deepcopy keeps the type.
        # Not `own`'s memo: it maps a tensor being owned to itself.
        out = kinds.safe_deepcopy(t, {}, None)
        if type(out) is type(t):
            return out
    out = t.detach().clone()
    if type(out) is not type(t):
        with contextlib.suppress(Exception):  # one that cannot wrap a tensor: the plain copy
            out = out.as_subclass(type(t))
    if t.requires_grad:
        out.requires_grad_(True)
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
        told = checked_size(sizeof(obj), obj)
        if told is not None:
            return told
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
        return head + _foreign_bytes(obj, root, buffers)
    if isinstance(obj, np.void) and _record_base(obj) is not None:  # a record viewing an array
        root = _array_root(_record_base(obj))
        if isinstance(root, np.ndarray):
            if id(root) in buffers:
                return sys.getsizeof(obj)
            buffers.add(id(root))
            return sys.getsizeof(obj) + root.nbytes
        return sys.getsizeof(obj) + _foreign_bytes(obj, root, buffers)
    if kinds.is_tensor(obj):
        head = sys.getsizeof(obj)
        if not _strided(obj):  # sparse and other layouts: their parts' bytes
            return head + _nbytes(_tensor_parts(obj), sizeof, seen, buffers)
        return head + _storage_bytes(obj, buffers)
    if kinds.is_jax(obj):
        return sys.getsizeof(obj) + _jax_bytes(obj)
    if kinds.is_image(obj):
        return sys.getsizeof(obj) + _image_bytes(obj)
    size = _getsizeof(obj)
    if isinstance(obj, (kinds.IMMUTABLE, bytearray, type)):
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
        if extra < 0:  # a negative count would take bytes off the ledger
            raise ArgumentError(
                f"the nbytes attribute of a {type(obj).__qualname__} item must be an int "
                f">= 0 (bytes it holds); got nbytes={extra!r}"
            )
        size += int(extra)
    if hasattr(obj, "__dict__"):
        size += _nbytes(vars(obj), sizeof, seen, buffers)
    for name in _slots(type(obj)):
        if hasattr(obj, name):
            size += _nbytes(getattr(obj, name), sizeof, seen, buffers)
    return size


def checked_size(told: object, obj: Any) -> int | None:
    """What a user's ``sizeof(obj)`` returned, as bytes (an int), or None.

    Taken: an int >= 0 (NumPy ints too), a whole float >= 0 (``1024.0``, ``1e6``: what
    arithmetic on sizes often gives), or None.

    The ledger adds it as it is: a negative count would make room that is not there, a bool,
    a fraction, NaN, inf or a str is no count of bytes. Refused where it enters, naming the
    object.

    Raises:
        ArgumentError: any other value.
    """
    if told is None:
        return None
    if isinstance(told, (int, np.integer)) and not isinstance(told, (bool, np.bool_)):
        count = int(told)
        if count >= 0:
            return count
    if isinstance(told, (float, np.floating)):
        number = float(told)
        if math.isfinite(number) and number >= 0 and number.is_integer():
            return int(number)
    raise ArgumentError(
        f"sizeof must return an int >= 0 (the bytes the object holds; NumPy ints and whole "
        f"floats too) or "
        f"None (count it as usual); sizeof(<{type(obj).__qualname__}>) returned {told!r}"
    )


def _getsizeof(obj: Any) -> int:
    """``sys.getsizeof(obj)``, naming the object's ``__sizeof__`` when it answers badly."""
    try:
        return sys.getsizeof(obj)
    except (TypeError, ValueError, OverflowError) as e:
        raise ArgumentError(
            f"{type(obj).__qualname__}.__sizeof__ must return an int >= 0 (bytes); "
            f"sys.getsizeof refused it: {e}"
        ) from e


def _elements(
    a: np.ndarray, sizeof: Callable[[Any], int | None] | None, seen: set[int], buffers: set[Any]
) -> int:
    return sum(_nbytes(x, sizeof, seen, buffers) for x in a.ravel(order="K"))


def _foreign_bytes(view: Any, root: Any, buffers: set[Any]) -> int:
    """Bytes of `root`, memory NumPy does not own that `view` pins, once per root."""
    if kinds.is_tensor(root):  # `tensor.numpy()`: the array pins the tensor's storage
        return _storage_bytes(root, buffers)
    if id(root) in buffers:
        return 0
    buffers.add(id(root))
    # A buffer of another kind (bytes, mmap): its own size, through the buffer protocol.
    return memoryview(root).nbytes if _has_buffer(root) else int(view.nbytes)


def _storage_bytes(t: Any, buffers: set[Any]) -> int:
    storage = t.untyped_storage()
    ident = ("torch", storage.data_ptr(), str(storage.device))
    if ident in buffers and storage.nbytes() > 0:
        return 0
    buffers.add(ident)
    return int(storage.nbytes())


def _jax_bytes(a: Any) -> int:
    """Bytes of JAX array `a` held by this process: each of its shards here, copies included."""
    try:
        return sum(int(shard.data.nbytes) for shard in a.addressable_shards)
    except (AttributeError, RuntimeError):  # deleted (donated) or not a concrete array
        return int(a.nbytes)


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
