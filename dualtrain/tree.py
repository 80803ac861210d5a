"""Pytrees without a framework: the containers `convert` and friends walk through.

A pytree is a nest of dicts (any Mapping subclass that can be rebuilt from its items,
defaultdict included), lists, tuples, namedtuples and dataclass instances. Everything else
is a leaf. The same containers come back, of the same types, in the same order. A container
may appear in several places (it is walked each time), but not inside itself.
"""

from __future__ import annotations

import copy as _copy
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from dualtrain.errors import ArgumentError

__all__ = ["Field", "format_path", "leaves", "map_with_path"]

Path = tuple[Any, ...]


class Field(str):
    """A path entry naming a dataclass field (a plain key names a mapping entry)."""

    __slots__ = ()


def map_with_path(fn: Callable[[Path, Any], Any], tree: Any) -> Any:
    """Rebuilds `tree` with every leaf replaced by ``fn(path, leaf)``.

    Args:
        fn: called once per leaf with the leaf's path (a tuple of keys, indices and field
            names from the root) and the leaf.
        tree: the pytree.

    Returns:
        A pytree of the same containers and types holding fn's results.

    Raises:
        ArgumentError: `tree` contains itself (a list holding itself, a dict cycle); the
            message names the path where the cycle closes.
    """
    return _map(fn, tree, (), {})


_LEAF, _MAPPING, _TUPLE, _LIST, _DATACLASS = range(5)
_kinds: dict[type, int] = {}


def _kind(cls: type) -> int:
    kind = _kinds.get(cls)
    if kind is None:
        if issubclass(cls, Mapping):
            kind = _MAPPING
        elif issubclass(cls, tuple):
            kind = _TUPLE
        elif issubclass(cls, list):
            kind = _LIST
        elif dataclasses.is_dataclass(cls):
            kind = _DATACLASS
        else:
            kind = _LEAF
        _kinds[cls] = kind
    return kind


def _map(fn: Callable[[Path, Any], Any], tree: Any, path: Path, open_: dict[int, Path]) -> Any:
    kind = _kind(type(tree))
    if kind == _LEAF:
        return fn(path, tree)
    # Containers being walked, by id: meeting one again below itself is a cycle, which would
    # otherwise recurse until RecursionError. A container shared by two branches is no cycle.
    key = id(tree)
    if key in open_:
        raise ArgumentError(
            f"tree must be a pytree without cycles; got {format_path(path)}, which is "
            f"{format_path(open_[key])} itself ({type(tree).__name__} containing itself)"
        )
    open_[key] = path
    try:
        return _rebuild(fn, tree, path, open_, kind)
    finally:
        del open_[key]


def _rebuild(
    fn: Callable[[Path, Any], Any], tree: Any, path: Path, open_: dict[int, Path], kind: int
) -> Any:
    if kind == _MAPPING:
        items = [(k, _map(fn, v, (*path, k), open_)) for k, v in tree.items()]
        cls: Any = type(tree)
        if isinstance(tree, defaultdict):
            return cls(tree.default_factory, items)
        return cls(items)
    if kind == _TUPLE:
        values = [_map(fn, v, (*path, i), open_) for i, v in enumerate(tree)]
        if hasattr(tree, "_fields"):  # namedtuple
            return type(tree)(*values)
        return type(tree)(values) if type(tree) is not tuple else tuple(values)
    if kind == _LIST:
        return type(tree)(_map(fn, v, (*path, i), open_) for i, v in enumerate(tree))
    out = _copy.copy(tree)
    for f in dataclasses.fields(tree):
        value = _map(fn, getattr(tree, f.name), (*path, Field(f.name)), open_)
        object.__setattr__(out, f.name, value)  # also works on frozen dataclasses
    return out


def leaves(tree: Any) -> list[Any]:
    """The leaves of `tree`, in the order `map_with_path` visits them."""
    found: list[Any] = []
    map_with_path(lambda _, leaf: found.append(leaf), tree)
    return found


def format_path(path: Path) -> str:
    """``('params', 0, 'w')`` -> ``"tree['params'][0].w"``-style text for error messages."""
    text = "tree"
    for key in path:
        text += f".{key}" if isinstance(key, Field) else f"[{key!r}]"
    return text
