"""Member bookkeeping for model batching: argument checks, member seeds, architectures.

A batched model holds `batch` members of one architecture; every parameter and state
tensor carries a leading member dimension. Both adapters validate through this module, so
torch and JAX refuse the same mistakes with the same words.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from dualtrain import backends
from dualtrain.errors import ArgumentError, ShapeError, bad_argument
from dualtrain.validate import check_int, check_seed

__all__ = [
    "ABSENT",
    "INITS",
    "REDUCTIONS",
    "STRATEGIES",
    "Entry",
    "Strategies",
    "check_batch",
    "check_class_ids",
    "check_flag",
    "check_init",
    "check_ks",
    "check_leading",
    "check_member",
    "check_memory_budget",
    "check_reduction",
    "check_scores",
    "shared_targets",
    "check_strategy",
    "architecture_key",
    "compare_architectures",
    "config_difference",
    "member_seeds",
    "refuse_member",
]

INITS = ("independent", "identical")
REDUCTIONS = ("mean", "sum", "none")


@dataclasses.dataclass(frozen=True)
class Strategies:
    """The ways an adapter runs the members, as data the core's checks and choice read.

    Attributes:
        names: what ``strategy=`` takes besides ``"auto"``, in the documentation's order.
        chunked: vmap's form in chunks, which a budget below every member turns vmap into.
        even_chunks: without a budget, `chunked` runs even chunks of at most
            `dispatch.CHUNK` members (torch's "chunked"); otherwise every member in one
            chunk (``lax.map`` without a batch size).
    """

    names: tuple[str, ...]
    chunked: str
    even_chunks: bool = False


# The ways each adapter runs the members, by backend name ("auto" measures them and keeps
# the fastest). Each adapter declares its own (``dualtrain_<name>.policy.STRATEGIES``).
DECLARED: Mapping[str, Strategies] = backends.Declared("STRATEGIES")
STRATEGIES: Mapping[str, tuple[str, ...]] = backends.Declared("STRATEGIES", "names")

# One tensor of an architecture: (name, per-member shape, dtype name, trainable).
Entry = tuple[str, tuple[int, ...], str, bool]


def check_batch(batch: object) -> int:
    """The member count: a positive int (NumPy ints too, no bools)."""
    return check_int("batch", batch, minimum=1)


def check_init(init: object) -> str:
    """``"independent"`` (each member drawn from its own seed) or ``"identical"``."""
    if not isinstance(init, str) or init not in INITS:
        raise bad_argument("init", init, f"one of {INITS}")
    return init


def strategies_of(backend: Strategies | str) -> Strategies:
    """The strategies an adapter declared, or those `DECLARED` for a backend's name."""
    return backend if isinstance(backend, Strategies) else DECLARED[backend]


def check_strategy(strategy: object, backend: Strategies | str) -> str:
    """``"auto"`` or one of the backend's strategies (`Strategies.names`)."""
    names = ("auto", *strategies_of(backend).names)
    if not isinstance(strategy, str) or strategy not in names:
        raise bad_argument("strategy", strategy, f"one of {names}")
    return strategy


def check_flag(name: str, value: object) -> bool:
    """A bool (NumPy's included); ints and strings are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise bad_argument(name, value, "a bool")
    return bool(value)


def check_memory_budget(budget: object) -> int | None:
    """None (no limit) or a positive number of bytes."""
    if budget is None:
        return None
    return check_int("memory_budget", budget, minimum=1)


def member_seeds(seed: object, batch: int) -> list[int]:
    """The realize seed of each member: member i equals ``realize(craft, seed=seeds[i])``.

    An int `seed` gives each member its own seed from NumPy's ``SeedSequence(seed,
    spawn_key=(i,))``, a derivation NumPy keeps stable across releases, so seeds 0 and 1 do
    not share members (``seed + i`` would make member 1 of seed 0 member 0 of seed 1). A
    sequence of `batch` ints gives the members those seeds as they are.

    Raises:
        ArgumentError: `seed` is not an int in [0, 2**64), nor `batch` of them.
    """
    if isinstance(seed, (list, tuple, np.ndarray)):
        if len(seed) != batch:
            raise bad_argument("seed", seed, f"an int or a sequence of batch={batch} ints")
        return [check_seed(f"seed[{i}]", s) for i, s in enumerate(seed)]
    base = check_seed("seed", seed)
    return [
        int(np.random.SeedSequence(base, spawn_key=(i,)).generate_state(1, np.uint64)[0])
        for i in range(batch)
    ]


def check_member(index: object, batch: int) -> int:
    """A member index in ``[-batch, batch)``, returned in ``[0, batch)``."""
    i = check_int("index", index, minimum=-batch, maximum=batch - 1)
    return i % batch


def shared_targets(outputs: Sequence[int], targets: Sequence[int], batch: int) -> bool:
    """Whether targets of shape `targets` are ``[B, ...]`` shared by every member.

    Per-member targets are ``[batch, B, ...]`` like the `outputs`; where both readings fit
    they are read as per member (docs/batching.md, "Losses and accuracies").

    Raises:
        ShapeError: outputs not ``[batch, B, ...]``, or targets of neither form.
    """
    outputs, targets = tuple(outputs), tuple(targets)
    if len(outputs) < 2:
        raise ShapeError(f"outputs must be [batch, B, ...]; got outputs of shape {outputs}")
    if targets[:2] == outputs[:2]:
        return False
    if not targets or targets[0] != outputs[1]:
        raise ShapeError(
            f"targets must be [batch, B, ...] or [B, ...] shared by every member, with "
            f"batch={batch} and B={outputs[1]}; got targets of shape {targets}"
        )
    return True


def check_leading(name: str, shape: Sequence[int], batch: int, layout: str) -> None:
    """Refuses an array whose leading dimension is not the member count.

    Args:
        name: what the array is, for the message (``"inputs[0]"``, ``"outputs"``).
        shape: its shape.
        batch: the member count.
        layout: the layout expected, for the message (``"[batch, B, ...]"``).
    """
    if len(shape) == 0 or int(shape[0]) != batch:
        raise ShapeError(
            f"{name} must have the member count as its leading dimension, {layout} with "
            f"batch={batch}; got {name} of shape {tuple(int(s) for s in shape)}"
        )


def check_scores(shape: Sequence[int], batch: int) -> None:
    """Refuses top-k scores that are not ``[batch, B, classes]``."""
    check_leading("outputs", shape, batch, "[batch, B, classes]")
    if len(shape) != 3:
        raise ShapeError(
            f"outputs must be [batch, B, classes]; got outputs of shape {tuple(shape)}"
        )


def check_class_ids(shape: Sequence[int], shared: bool) -> None:
    """Refuses top-k targets that are not class ids ``[batch, B]`` (``[B]`` when `shared`)."""
    if len(shape) != (1 if shared else 2):
        raise ShapeError(
            f"targets must be class ids [batch, B] or [B]; got targets of shape {tuple(shape)}"
        )


def check_reduction(reduction: object) -> str:
    """``"mean"``, ``"sum"`` or ``"none"``, as torch's losses take it."""
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise bad_argument("reduction", reduction, f"one of {REDUCTIONS}")
    return reduction


def check_ks(ks: object) -> tuple[int, ...]:
    """A non-empty sequence of positive ints (the k of each top-k fraction)."""
    if isinstance(ks, (int, np.integer)) and not isinstance(ks, bool):
        ks = (ks,)
    if not isinstance(ks, Iterable) or isinstance(ks, (str, bytes)):
        raise bad_argument("ks", ks, "a non-empty sequence of positive ints")
    out = tuple(ks)
    if not out or not all(
        isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in out
    ):
        raise bad_argument("ks", ks, "a non-empty sequence of positive ints")
    if min(out) < 1:
        raise bad_argument("ks", ks, "a non-empty sequence of positive ints")
    return tuple(int(k) for k in out)


def compare_architectures(
    reference: Sequence[Entry], other: Sequence[Entry], name: str, kind: str = ""
) -> None:
    """Refuses `other` unless its tensors have the reference's names, shapes and dtypes.

    Args:
        reference: the first member's entries.
        other: the entries of the module compared with it.
        name: how the caller names the other module (``"modules[2]"``, ``"module"``).
        kind: the class names, when they differ, to say so first.

    Raises:
        ArgumentError: naming the first difference: a missing or extra tensor, a shape, a
            dtype or whether it is trainable.
    """
    if kind:
        raise ArgumentError(f"{name} must have the first member's architecture; {kind}")
    ref = {e[0]: e for e in reference}
    got = {e[0]: e for e in other}
    missing = [n for n in ref if n not in got]
    extra = [n for n in got if n not in ref]
    if missing or extra:
        raise ArgumentError(
            f"{name} must have the first member's architecture; it lacks {missing} and has "
            f"{extra} beyond it"
        )
    for key, (_, shape, dtype, trainable) in ref.items():
        _, oshape, odtype, otrainable = got[key]
        if tuple(oshape) != tuple(shape) or odtype != dtype or otrainable != trainable:
            raise ArgumentError(
                f"{name} must have the first member's architecture; {key} is "
                f"{_describe(oshape, odtype, otrainable)} there but "
                f"{_describe(shape, dtype, trainable)} in the first member"
            )


def _describe(shape: Sequence[int], dtype: str, trainable: bool) -> str:
    kind = "parameter" if trainable else "state"
    return f"a {dtype} {kind} of shape {tuple(shape)}"


def architecture_key(kind: str, entries: Sequence[Entry]) -> tuple[Any, ...]:
    """A hashable signature of an architecture: its class and every tensor's entry."""
    return (kind, tuple((n, tuple(s), d, t) for n, s, d, t in entries))


def refuse_member(name: str, detail: str) -> ArgumentError:
    """The error for a member unlike the first: `name` (``"modules[2]"``) and what differs."""
    return ArgumentError(f"{name} must have the first member's architecture; {detail}")


class _Absent:
    def __repr__(self) -> str:
        return "absent"


# An attribute one member has and the other lacks: compared as a value of its own.
ABSENT: Any = _Absent()
_SCALARS = (type(None), _Absent, bool, int, float, complex, str, bytes, np.generic)


def config_difference(reference: Any, other: Any, path: str) -> str | None:
    """Where `other`'s configuration first differs from `reference`'s, or None.

    A batch runs every member through the first member's code and settings (a Craft's or
    module's hyperparameters: a dropout rate, an epsilon, an activation), so those must be
    equal. Values, not identities, are compared, so equal settings built separately in each
    member agree:

    - arrays and tensors are the members' own values: never compared;
    - plain values (numbers, strings, None, enums, classes, dtypes, devices, and lists,
      tuples and dicts of them) by ``==``;
    - functions by code, defaults and closure (recursively); bound methods by function and
      object; ``functools.partial`` by function, args and keywords; named callables without
      code (builtins, ufuncs, jitted functions) by name and wrapped function;
    - other objects with a ``__dict__`` attribute by attribute (private ``_`` names left out);
    - objects whose type defines ``==`` by it;
    - anything else (no settings to read and an identity-only ``==``: a lock, a handle) is
      skipped: its identity says nothing about how the member runs.

    Args:
        reference: the first member's value.
        other: the other member's.
        path: the value's name, for the message (``"craft.rate"``).

    Returns:
        ``"<path> is <other> there but <reference> in the first member"``, or None.
    """
    return _difference(reference, other, path, set())


def _difference(a: Any, b: Any, path: str, seen: set[int]) -> str | None:
    def differs(x: object, y: object) -> str:
        return f"{path} is {_short(y)} there but {_short(x)} in the first member"

    if _is_array(a) and _is_array(b):
        return None  # the member's own values, stacked row by row
    if type(a) is not type(b):
        return differs(a, b)
    if isinstance(a, _SCALARS):
        same = a == b or (a != a and b != b)  # NaN settings are equal settings
        return None if bool(same) else differs(a, b)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return differs(a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if (found := _difference(x, y, f"{path}[{i}]", seen)) is not None:
                return found
        return None
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path} has keys {list(b)} there but {list(a)} in the first member"
        for k in a:
            if (found := _difference(a[k], b[k], f"{path}[{k!r}]", seen)) is not None:
                return found
        return None
    if a is b or id(a) in seen:
        return None
    if isinstance(a, functools.partial):  # rebuilt in each member: equal when its parts are
        for part, x, y in [("func", a.func, b.func), ("args", a.args, b.args)]:
            if (found := _difference(x, y, f"{path}.{part}", seen)) is not None:
                return found
        x, y = dict(sorted(a.keywords.items())), dict(sorted(b.keywords.items()))
        return _difference(x, y, f"{path}.keywords", seen)
    if isinstance(a, types.MethodType):  # the same function of an equal object
        found = _difference(a.__func__, b.__func__, path, seen)
        return found or _difference(a.__self__, b.__self__, f"{path}.__self__", seen)
    if isinstance(a, types.FunctionType):  # the same code, defaults and cells
        if b.__code__ is not a.__code__:
            return differs(a, b)
        parts: list[tuple[Any, Any, str]] = [(a.__defaults__, b.__defaults__, "defaults")]
        parts += [
            (a.__kwdefaults__, b.__kwdefaults__, "defaults"),
            (_cells(a), _cells(b), "closure"),
        ]
        for x, y, what in parts:
            if (found := _difference(x, y, f"{path} (its {what})", seen)) is not None:
                return found
        return None
    if isinstance(a, (enum.Enum, type)) or _is_dtype(a):  # singletons: identity is value
        return None if a == b else differs(a, b)
    if callable(a) and isinstance(_name(a)[1], str):  # a builtin, a ufunc, a jitted function
        if _name(a) != _name(b):
            return differs(a, b)
        wrapped = getattr(a, "__wrapped__", None), getattr(b, "__wrapped__", None)
        if wrapped[0] is not None or wrapped[1] is not None:
            return _difference(*wrapped, f"{path} (the function it wraps)", seen)
        if isinstance(a, types.BuiltinMethodType):  # one method of an equal object
            owner = getattr(a, "__self__", None), getattr(b, "__self__", None)
            if not isinstance(owner[0], (types.ModuleType, type)):
                return _difference(*owner, f"{path}.__self__", seen)
        return None
    attrs_a, attrs_b = getattr(a, "__dict__", None), getattr(b, "__dict__", None)
    if isinstance(attrs_a, dict) and isinstance(attrs_b, dict):
        # A plain object: its public attributes are its settings (none: nothing to differ).
        seen.add(id(a))
        names = [k for k in attrs_a if not k.startswith("_")]
        names += [k for k in attrs_b if not k.startswith("_") and k not in attrs_a]
        for k in names:
            x, y = attrs_a.get(k, ABSENT), attrs_b.get(k, ABSENT)
            if (found := _difference(x, y, f"{path}.{k}", seen)) is not None:
                return found
        return None
    if getattr(type(a), "__eq__", None) is object.__eq__:
        return None  # no settings and an identity-only ==: not a setting the batch copies
    try:  # a value type: its == says
        return None if bool(a == b) else differs(a, b)
    except Exception:  # an == that gives no answer: nothing to compare by
        return None


def _name(value: object) -> tuple[Any, Any]:
    """A named callable's module and qualified name (None where it has none)."""
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return getattr(value, "__module__", None), name


def _is_dtype(value: object) -> bool:
    """A framework's dtype object (torch's): a singleton with identity ``==``.

    Known by its ``itemsize`` and ``is_floating_point`` and no ``__dict__``, without naming
    a framework; NumPy's dtypes have no ``is_floating_point`` (they compare by ``==``).
    """
    return (
        hasattr(value, "itemsize")
        and hasattr(value, "is_floating_point")
        and not hasattr(value, "__dict__")
    )


def _is_array(value: object) -> bool:
    """Tensors and arrays (NumPy, torch, JAX): anything with a shape and a dtype."""
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic)


def _cells(fn: Any) -> list[Any]:
    try:
        return [c.cell_contents for c in fn.__closure__ or ()]
    except ValueError:  # an empty cell
        return []


def _short(value: object) -> str:
    text = repr(value) if isinstance(value, _SCALARS) else f"a {type(value).__qualname__}"
    return text if len(text) <= 80 else text[:77] + "..."
