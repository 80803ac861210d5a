"""What kind of object an item holds (torch, JAX, Pillow, immutable), without importing any.

Shared by the byte count (`sizes`) and the copies a hit returns (`copies`).
"""

from __future__ import annotations

import copy
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "IMMUTABLE", "is_image", "is_jax", "is_plain", "is_tensor", "kind", "rebuild",
    "safe_deepcopy",
]  # fmt: skip

IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), np.generic, range)


# Kind of each type met ("torch", "jax", "PIL" or ""), found once from its classes: a user's
# subclass of torch.Tensor or of PIL.Image.Image is one too. The core imports neither.
_KINDS: dict[type, str] = {}
_KIND_CLASSES = {
    ("torch", "Tensor"): "torch",
    ("torch._tensor", "Tensor"): "torch",
    ("jax", "Array"): "jax",
    ("PIL.Image", "Image"): "PIL",
}


def kind(cls: type) -> str:
    """The kind of `cls` ("torch", "jax", "PIL" or ""), from its classes, subclasses too."""
    kind = _KINDS.get(cls)
    if kind is None:
        kind = ""
        for klass in cls.__mro__:
            module = klass.__module__
            if (module, klass.__name__) in _KIND_CLASSES:
                kind = _KIND_CLASSES[module, klass.__name__]
                break
            if module.partition(".")[0] in ("jax", "jaxlib") and klass.__name__ == "ArrayImpl":
                kind = "jax"
                break
        _KINDS[cls] = kind
    return kind


def is_tensor(obj: object) -> bool:
    """Whether `obj` is a torch tensor (of any subclass)."""
    return kind(type(obj)) == "torch" and hasattr(obj, "untyped_storage")


def is_jax(obj: object) -> bool:
    """Whether `obj` is a JAX array."""
    return kind(type(obj)) == "jax" and hasattr(obj, "nbytes")


def is_image(obj: object) -> bool:
    """Whether `obj` is a Pillow image (of any subclass)."""
    return kind(type(obj)) == "PIL" and hasattr(obj, "getbands") and hasattr(obj, "size")


def is_plain(obj: object, module: str, name: str) -> bool:
    """Whether `obj`'s type is exactly the class `module.name` (not a subclass)."""
    cls = type(obj)
    return cls.__name__ == name and cls.__module__ == module


def rebuild(obj: Any, each: Callable[[Any], Any], *, only_if_changed: bool) -> Any:
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


def safe_deepcopy(obj: Any, memo: dict[int, Any], default: Any) -> Any:
    """``copy.deepcopy(obj)`` sharing copies with `memo` both ways; `default` if it raises.

    The deep copy writes to a memo of its own over `memo`, merged only if it succeeds (a
    failed one may leave half-built copies). Its entries name objects by id, temporaries
    too: the list of objects it keeps alive moves to ``memo[id(memo)]`` (deepcopy's own
    convention), so no id in `memo` is reused while `memo` lives.
    """
    chain: ChainMap[int, Any] = ChainMap({}, memo)
    try:
        out = copy.deepcopy(obj, chain)  # type: ignore[arg-type]
    except Exception:  # not copyable (an open file, a lock, a non-leaf tensor)
        return default
    made = chain.maps[0]
    kept = made.pop(id(chain), [])
    memo.update(made)
    memo.setdefault(id(memo), []).extend(kept)
    return out
