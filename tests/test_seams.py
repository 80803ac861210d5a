"""Every core -> adapter seam is a typed contract: each adapter part meets its Protocol.

`backends.PARTS` lists every part the core may load and the Protocol (in the consumer's
``seams`` module) each adapter's module must meet. mypy checks the types (each seam's typed
accessor, and the assignments at the end of each adapter's ``__init__``); these tests check,
at run time, the names the core reaches and their signatures: parameter names, kinds and
defaults. Annotations are left to mypy.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
import typing
from typing import Any, Protocol

import numpy as np
import pytest

from dualtrain import ArgumentError, backends
from dualtrain.craft import reference

ADAPTERS = ("torch", "jax")
CASES = [(name, part) for part in backends.PARTS for name in ADAPTERS]


def protocol_members(protocol: type) -> dict[str, Any]:
    """The members a Protocol declares (its own and its Protocol bases'), by name.

    Methods map to their function, attributes declared by annotation alone to None.
    """
    members: dict[str, Any] = {}
    for cls in reversed(protocol.__mro__):
        if cls in (object, Protocol, typing.Generic) or not getattr(cls, "_is_protocol", False):
            continue
        members.update(dict.fromkeys(inspect.get_annotations(cls)))
        members.update(vars(cls))
    # Protocol's own machinery and dunders (`__init__`, `__call__`) are not module members.
    return {name: value for name, value in members.items() if not name.startswith("_")}


def _parameters(fn: Any, *, bound: bool) -> list[inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())
    return params[1:] if bound else params  # a Protocol method's `self`


def mismatches(module: types.ModuleType, protocol: type) -> list[str]:
    """How `module` fails `protocol`: missing or unexported names, different signatures.

    A Protocol parameter before ``/`` is passed by position: the adapter may name it as it
    likes (and take it by keyword too). Every other parameter must agree in name, kind and
    default; the adapter may have no parameter the Protocol lacks.
    """
    problems = []
    exported = getattr(module, "__all__", None)
    for name, member in protocol_members(protocol).items():
        if not hasattr(module, name):
            problems.append(f"{module.__name__} has no {name}")
            continue
        if exported is not None and name not in exported:
            problems.append(f"{module.__name__}.{name} is not in its __all__")
        if member is None:
            continue
        want = _parameters(member, bound=True)
        try:
            got = _parameters(getattr(module, name), bound=False)
        except (TypeError, ValueError):
            problems.append(f"{module.__name__}.{name} is not callable with a signature")
            continue
        if len(want) != len(got):
            problems.append(f"{module.__name__}.{name}{_show(got)} != Protocol {_show(want)}")
            continue
        for w, g in zip(want, got, strict=True):
            if w.kind is inspect.Parameter.POSITIONAL_ONLY:
                same = g.kind in (w.kind, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            else:
                same = (g.name, g.kind) == (w.name, w.kind)
            if not same or not _same_default(w.default, g.default):
                problems.append(
                    f"{module.__name__}.{name}: parameter {g.name!r} differs from the "
                    f"Protocol's {w.name!r}: {_show(got)} != {_show(want)}"
                )
    return problems


def _same_default(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a is b or a == b)


def _show(params: list[inspect.Parameter]) -> str:
    return str(inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in params]))


@pytest.mark.parametrize(("name", "part"), CASES)
def test_each_adapter_part_meets_its_protocol(name, part):
    protocol = backends.seam(name, part)
    assert getattr(protocol, "_is_protocol", False), f"{protocol} is not a typing.Protocol"
    assert protocol_members(protocol), f"{protocol.__name__} declares nothing"
    module = backends.load_part(name, part)
    assert module.__name__ == f"dualtrain_{name}.{part}"
    assert mismatches(module, protocol) == []


@pytest.mark.parametrize("part", list(backends.PARTS))
def test_every_part_names_a_protocol_for_both_adapters(part):
    assert set(backends.PARTS[part]) == set(ADAPTERS)
    torch_seam, jax_seam = (backends.seam(name, part) for name in ADAPTERS)
    # What the core may use without knowing the adapter is what both provide: torch's
    # Protocol is the shared one or widens it.
    assert jax_seam in torch_seam.__mro__ or torch_seam in jax_seam.__mro__


def test_load_part_refuses_a_part_without_a_protocol():
    with pytest.raises(ArgumentError, match=r"part must be one of 'layers'.*; got part='backend'"):
        backends.load_part("torch", "backend")
    with pytest.raises(ArgumentError, match="got part='transfer'"):
        backends.seam("jax", "transfer")


def test_the_typed_accessors_and_the_table_agree():
    """mypy reads the accessors, the tests read PARTS: each accessor returns the table's.

    Each seam module has ``<part>_part(name)`` typed as the Protocol both adapters meet, and
    ``torch_<part>_part()`` where torch's part meets a wider one; each returns the adapter's
    module (the overloads of `load_part` did this before it was left untyped, so that the
    registry imports none of its consumers' contracts).
    """
    typed = {}
    for part, protocols in backends.PARTS.items():
        seams = importlib.import_module(protocols["jax"].partition(":")[0])
        accessor = getattr(seams, f"{part}_part")
        torch_accessor = getattr(seams, f"torch_{part}_part", None)
        for name in ADAPTERS:
            if name == "torch" and torch_accessor is not None:
                returned, module = torch_accessor.__annotations__["return"], torch_accessor()
            else:
                returned, module = accessor.__annotations__["return"], accessor(name)
            assert module is importlib.import_module(f"dualtrain_{name}.{part}"), (name, part)
            typed[name, part] = returned
    assert set(typed) == set(CASES)
    for (name, part), returned in typed.items():
        assert backends.PARTS[part][name].rpartition(":")[2] == returned, (name, part)


@pytest.mark.parametrize("name", ADAPTERS)
def test_each_ops_table_has_the_references_ops(name):
    ops = backends.load_part(name, "layers").OPS
    assert set(ops) == set(reference.OPS)
    assert all(callable(op) for op in ops.values())


@pytest.mark.parametrize("name", ADAPTERS)
def test_a_courier_to_the_cpu_hands_a_batch_over(name):
    courier = backends.load_part(name, "data").Courier("cpu")
    batch = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "n": 3}
    out = courier(batch)
    assert backends.backend_of(out["x"]).name == name
    assert out["n"] == 3
    np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"])


# ---- the checker itself: it fails on what an adapter may drift into -----------------------


class _Seam(Protocol):
    def fit(self, craft: Any, state: Any, /, *, lr: float = 0.1, steps: int) -> Any: ...


def _module(fn: Any, exported: bool = True) -> types.ModuleType:
    module = types.ModuleType("drifted")
    if fn is not None:
        module.fit = fn
    module.__all__ = ["fit"] if exported else []
    return module


def _ok(craft, opt_state, *, lr=0.1, steps): ...
def _renamed(craft, state, *, rate=0.1, steps): ...
def _default(craft, state, *, lr=0.2, steps): ...
def _kind(craft, state, lr=0.1, *, steps): ...
def _more(craft, state, *, lr=0.1, steps, seed): ...
def _fewer(craft, state, *, lr=0.1): ...


@pytest.mark.parametrize(
    ("fn", "exported", "why"),
    [
        (None, True, "has no fit"),
        (_ok, False, "not in its __all__"),
        (_renamed, True, "parameter 'rate'"),
        (_default, True, "parameter 'lr'"),
        (_kind, True, "parameter 'lr'"),
        (_more, True, r"fit\(craft, state, \*, lr=0.1, steps, seed\)"),
        (_fewer, True, r"fit\(craft, state, \*, lr=0.1\)"),
    ],
)
def test_the_check_catches_drift(fn, exported, why):
    assert mismatches(_module(_ok), _Seam) == []  # a positional-only name is free
    (problem,) = mismatches(_module(fn, exported), _Seam)
    assert re.search(why, problem), problem


def test_protocol_members_include_inherited_ones():
    seam = importlib.import_module("dualtrain.checkpoint.seams")
    torch_members = protocol_members(seam.TorchCheckpointPart)
    assert set(protocol_members(seam.CheckpointPart)) < set(torch_members)
    assert {"export_scheduler", "check_scheduler", "export_rng"} <= set(torch_members)
