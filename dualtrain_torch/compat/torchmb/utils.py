"""torchmb's registry and per-member helpers (``torchmb.utils``).

`register_batch_module` records a hand-written `AbstractBatchModule` for its ``base_class``;
the compat `BatchModule` then runs that class's modules through it as a fast path, checked
against the generic ``torch.func`` path on the first call. `to_batch_func` runs one function
per member (``vmap`` over the members); `to_batch_module` gives a registered batch module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import fx, nn
from torch.func import vmap
from torch.utils import _pytree as pytree

from dualtrain.batching import members
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_torch.compat.torchmb.base import AbstractBatchModule
from dualtrain_torch.compat.torchmb.functional import check_order, from_members, to_members
from dualtrain_torch.compat.torchmb.types import DataOrder

__all__ = [
    "BATCH_MODULES",
    "register_batch_module",
    "register_module",
    "registered_for",
    "to_batch_func",
    "to_batch_module",
]

# base class -> its batch module; torchmb looks modules up by exact type, so do we.
BATCH_MODULES: dict[type[nn.Module], type[AbstractBatchModule]] = {}

B = TypeVar("B", bound=type[nn.Module])


def register_batch_module(cls: B) -> B:
    """Registers a batch module for its ``base_class``; returns `cls` (a decorator too).

    As torchmb's README writes it, `cls` may also be the base class itself: the one
    `AbstractBatchModule` subclass that names it as its ``base_class`` is registered (of a
    class defined several times under one name, the latest definition).

    Raises:
        ArgumentError: `cls` is not a class; a batch module that leaves ``base_class`` at
            ``nn.Module``; a base class no batch module names, or several do.
    """
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise bad_argument("cls", cls, "an AbstractBatchModule subclass or its base class")
    if issubclass(cls, AbstractBatchModule):
        base = cls.base_class
        if base is nn.Module or not (isinstance(base, type) and issubclass(base, nn.Module)):
            raise bad_argument(
                "cls", cls, "a batch module whose base_class names the module class it batches"
            )
        BATCH_MODULES[base] = cls
        return cls
    if cls is nn.Module:
        raise bad_argument("cls", cls, "a module class of yours, not nn.Module itself")
    found = [c for c in _subclasses(AbstractBatchModule) if c.__dict__.get("base_class") is cls]
    # One class defined again (a notebook cell run twice) counts once: its latest definition.
    latest = {(c.__module__, c.__qualname__): c for c in found}
    found = list(latest.values())
    if len(found) != 1:
        names = [c.__name__ for c in found]
        raise ArgumentError(
            f"register_batch_module got the module class {cls.__name__}: exactly one "
            f"AbstractBatchModule subclass must have base_class = {cls.__name__}; "
            + (f"found {names}: pass the one to use" if names else "found none: define it first")
        )
    BATCH_MODULES[cls] = found[0]
    return cls


register_module = register_batch_module  # the name torchmb's README gives it in prose


def registered_for(module: nn.Module) -> type[AbstractBatchModule] | None:
    """The batch module registered for ``type(module)``, or None."""
    return BATCH_MODULES.get(type(module))


def _subclasses(cls: type[AbstractBatchModule]) -> list[type[AbstractBatchModule]]:
    out: list[type[AbstractBatchModule]] = []
    todo: list[Callable[[], list[Any]]] = [cls.__subclasses__]
    while todo:
        for sub in todo.pop()():
            out.append(sub)
            todo.append(sub.__subclasses__)
    return out


def to_batch_func(
    node: fx.Node | Callable[..., Any], batch: int, data_order: DataOrder = "g b"
) -> Callable[..., Any]:
    """`node`'s function run for each member on its own slice (``vmap`` over the members).

    torchmb's signature: `node` is a ``call_function`` node of a ``torch.fx`` graph, or (as
    torchmb's own tests pass it) the function itself. The function returned takes the same
    arguments with every tensor in `data_order` (``[G, B, ...]`` for ``'g b'``) and returns
    its outputs in that order; member g's rows see only member g's rows, so a softmax, a
    ``mean(0)`` over the samples or any other function is that member's own.

    Raises:
        ArgumentError: `node` is neither a function nor a ``call_function`` node; a bad
            `batch` or `data_order`; a call without any tensor argument.
        ShapeError: a tensor argument without G where `data_order` puts it.
    """
    func = _function_of(node)
    batch = members.check_batch(batch)
    order = check_order(data_order)
    name = getattr(func, "__name__", type(func).__name__)

    def per_member(*args: Any, **kwargs: Any) -> Any:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        if not where:
            raise ArgumentError(
                f"batch_{name} needs at least one tensor argument in data_order {order!r} "
                "(the members are read from it); got none"
            )
        stacked = [to_members(leaves[i], batch, order) for i in where]

        def one(*rows: torch.Tensor) -> Any:
            filled = list(leaves)
            for i, row in zip(where, rows, strict=True):
                filled[i] = row
            a, k = pytree.tree_unflatten(filled, spec)
            return func(*a, **k)

        out = vmap(one, randomness="different")(*stacked)
        return pytree.tree_map(
            lambda t: from_members(t, order) if isinstance(t, torch.Tensor) else t, out
        )

    functools.update_wrapper(per_member, func)
    per_member.__name__ = f"batch_{name}"
    per_member.__qualname__ = f"batch_{getattr(func, '__qualname__', name)}"
    return per_member


def _function_of(node: object) -> Callable[..., Any]:
    if isinstance(node, fx.Node):
        if node.op == "call_function" and callable(node.target):
            return node.target
        raise bad_argument(
            "node", node.format_node(), "a call_function node (modules: use BatchModule)"
        )
    if not callable(node) or isinstance(node, (type, nn.Module)):
        raise bad_argument(
            "node", node, "a function or a torch.fx call_function node (modules: BatchModule)"
        )
    return node


def to_batch_module(node: fx.Node | None, module: nn.Module, batch: int) -> AbstractBatchModule:
    """The registered batch module for `module` (`batch` members, each starting as `module`).

    torchmb's signature; `node` is not read. Its forward takes merged ``(b g)`` tensors.

    Raises:
        ArgumentError: `module` is not an ``nn.Module``, or no batch module is registered
            for its class: ``BatchModule(module, batch)`` runs any module per member (with
            ``merge=False, split=False`` for merged ``(b g)`` tensors).
    """
    if not isinstance(module, nn.Module):
        raise bad_argument("module", module, "a torch nn.Module")
    batch = members.check_batch(batch)
    cls = registered_for(module)
    if cls is None:
        raise ArgumentError(
            f"module must be of a class with a registered batch module; got "
            f"{type(module).__name__}, which has none. BatchModule(module, {batch}) runs any "
            "module per member through torch.func (call it with merge=False, split=False "
            "for merged (b g) tensors), or register one with register_batch_module"
        )
    return cls.from_module(module, batch)
