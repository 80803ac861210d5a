"""The user's arguments to a ladder: ``backends=`` (`parse_backends`) and `LadderOptions`."""

from __future__ import annotations

import enum
import math
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from dualtrain.accelerate import DEFAULTS, RUNGS, LadderOptions, default_folder, parse_backends
from dualtrain.accelerate.rungs import EAGER
from dualtrain.errors import ArgumentError

FRAMEWORKS = ("torch", "jax")


class Named:
    """An enum-like object with only a ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:  # test ids must not hold addresses (xdist compares them)
        return f"Named({self.name!r})"


class Valued:
    """An enum-like object with only a ``value``."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Valued({self.value!r})"


class Opaque:
    """Neither a name nor an iterable."""

    def __repr__(self) -> str:
        return "Opaque()"


class NebulgymBackend(enum.StrEnum):  # nebulgym's (str, Enum) of its backends
    PYTORCH = "PYTORCH"
    TORCHSCRIPT = "TORCHSCRIPT"
    ONNXRUNTIME = "ONNXRUNTIME"
    RAMMER = "RAMMER"


def enum_member(enum_name: str, name: str, value: object) -> enum.Enum:
    """The member `name` (of value `value`) of a new enum class."""
    return getattr(enum.Enum(enum_name, {name: value}), name)


def spellings(name: str) -> st.SearchStrategy[object]:
    """`name` as a user may write it: any case, padded, an enum member or enum-like object."""
    cased = st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
        lambda ups: "".join(c.upper() if up else c.lower() for c, up in zip(name, ups, strict=True))
    )
    padded = st.tuples(st.sampled_from(["", " "]), cased, st.sampled_from(["", "\t"])).map("".join)
    member = enum_member("Backend", name, name.lower())
    # an enum whose values are not rung names: its member's name is
    opaque = enum_member("Opaque", name, f"{name.lower()}-backend")
    int_valued = enum_member("Numbered", name, 7)
    return st.one_of(
        padded,
        cased.map(Named),
        cased.map(Valued),
        st.just(member),
        st.just(opaque),
        st.just(int_valued),
    )


@st.composite
def backend_lists(draw: st.DrawFn, framework: str) -> tuple[list[str], list[object]]:
    """A non-empty ordered choice of rungs (repeats allowed) and the user's spelling of it."""
    names = draw(st.lists(st.sampled_from(sorted(RUNGS[framework])), min_size=1, max_size=10))
    return names, [draw(spellings(n)) for n in names]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@given(data=st.data())
def test_parse_backends_keeps_order_drops_repeats_and_ends_with_eager(framework, data):
    names, spelled = data.draw(backend_lists(framework))
    got = parse_backends(spelled, framework)
    eager = EAGER[framework]
    assert got[-1] == eager
    assert len(set(got)) == len(got)
    assert set(got) == set(names) | {eager}
    # the others keep the order of their first mention
    firsts = list(dict.fromkeys(n for n in names if n != eager))
    assert list(got[:-1]) == firsts
    # the result is a fixed point
    assert parse_backends(got, framework) == got
    if len(got) > 1:  # the eager rung alone is a ladder; nothing at all is not
        assert parse_backends(got[-2::-1], framework) == (*got[-2::-1], eager)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@given(data=st.data())
def test_parse_backends_any_permutation_of_all_rungs(framework, data):
    order = data.draw(st.permutations(sorted(RUNGS[framework])))
    got = parse_backends(order, framework)
    assert got == (*[n for n in order if n != EAGER[framework]], EAGER[framework])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_parse_backends_none_is_the_defaults(framework):
    assert parse_backends(None, framework) == DEFAULTS[framework]
    assert DEFAULTS[framework][-1] == EAGER[framework]
    assert set(DEFAULTS[framework]) <= set(RUNGS[framework])


def test_parse_backends_single_name_and_nebulgym_enum():
    assert parse_backends("jit", "jax") == ("JIT", "EAGER")
    assert parse_backends(" eager ", "jax") == ("EAGER",)
    assert parse_backends([NebulgymBackend.RAMMER, NebulgymBackend.PYTORCH], "torch") == (
        "RAMMER",
        "PYTORCH",
    )
    assert parse_backends(NebulgymBackend.ONNXRUNTIME, "torch") == ("ONNXRUNTIME", "PYTORCH")
    assert parse_backends(iter(["JIT", "jit_donate"]), "jax") == ("JIT", "JIT_DONATE", "EAGER")


def test_parse_backends_enum_whose_value_is_not_a_rung():
    # "enum members whose name or value is one": the name counts when the value does not
    jit = enum_member("Backend", "JIT", "jax.jit")
    assert parse_backends([jit], "jax") == ("JIT", "EAGER")

    class StrBackend(enum.StrEnum):
        TORCH_COMPILE = "inductor"

    assert parse_backends([StrBackend.TORCH_COMPILE], "torch") == ("TORCH_COMPILE", "PYTORCH")


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    "value",
    [
        ["NOT_A_RUNG"],
        "NOT_A_RUNG",
        ["JIT_DONATE_X"],
        [""],
        [None],
        [3],
        [Named("nope")],
        [Valued(1.5)],
        [],
        (),
        "",
        42,
        3.5,
        Opaque(),
        b"JIT",
    ],
    ids=repr,
)
def test_parse_backends_rejects_unknown_empty_and_non_iterables(framework, value):
    with pytest.raises(ArgumentError) as raised:
        parse_backends(value, framework)
    message = str(raised.value)
    assert "backends" in message
    assert repr(value) in message


def test_parse_backends_error_lists_the_known_rungs():
    with pytest.raises(ArgumentError, match="JIT_DONATE, JIT, EAGER"):
        parse_backends(["TORCH_COMPILE"], "jax")  # another framework's rung


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_parse_backends_one_unknown_among_known_ones(framework):
    known = list(RUNGS[framework])
    with pytest.raises(ArgumentError, match="backends"):
        parse_backends([*known, "FASTEST"], framework)


# -- LadderOptions ------------------------------------------------------------------------

BAD_NUMBERS = [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, True, False, "5", None, [1]]
POSITIVE_FIELDS = ("compile_budget", "warm_steps", "min_speedup", "max_signatures")


@pytest.mark.parametrize("field", POSITIVE_FIELDS)
@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_options_reject_bad_positive_values(field, value):
    with pytest.raises(ArgumentError) as raised:
        LadderOptions(**{field: value})
    assert field in str(raised.value)
    assert repr(value) in str(raised.value)


@pytest.mark.parametrize("field", ("warm_steps", "max_signatures"))
@pytest.mark.parametrize("value", [2.0, 1.5, 3.0e0], ids=repr)
def test_options_integer_fields_reject_floats(field, value):
    with pytest.raises(ArgumentError, match=field):
        LadderOptions(**{field: value})


@pytest.mark.parametrize("field", ("rtol", "atol"))
@pytest.mark.parametrize(
    "value", [-1e-9, -1, math.nan, math.inf, -math.inf, True, False, "1e-3", [0.1]], ids=repr
)
def test_options_reject_bad_tolerances(field, value):
    with pytest.raises(ArgumentError) as raised:
        LadderOptions(**{field: value})
    assert field in str(raised.value)
    assert repr(value) in str(raised.value)


@pytest.mark.parametrize("value", [0, 1, None, 1.5, ["a"], b"folder", ""], ids=repr)
def test_options_reject_bad_cache(value):
    with pytest.raises(ArgumentError, match="cache"):
        LadderOptions(cache=value)


@pytest.mark.parametrize("value", [None, 0.0, 5, "perf_counter", [1.0]], ids=repr)
def test_options_reject_a_clock_that_cannot_be_called(value):
    with pytest.raises(ArgumentError) as raised:
        LadderOptions(clock=value)
    assert "clock" in str(raised.value)
    assert repr(value) in str(raised.value)


def test_options_time_with_the_performance_counter_unless_told():
    ticks = iter(range(100))
    fake = LadderOptions(clock=lambda: float(next(ticks)))
    assert fake.clock() == 0.0 and fake.clock() == 1.0
    assert LadderOptions().clock is time.perf_counter
    assert "clock" not in repr(LadderOptions())  # the report's repr stays the numbers


@given(
    rtol=st.none() | st.floats(0, 10) | st.integers(0, 10),
    atol=st.none() | st.floats(0, 10),
    budget=st.floats(1e-6, 1e6) | st.integers(1, 1000),
    warm=st.integers(1, 100),
    speed=st.floats(1e-3, 100),
    sigs=st.integers(1, 100),
)
def test_options_accept_good_values(rtol, atol, budget, warm, speed, sigs):
    options = LadderOptions(rtol, atol, budget, warm, speed, sigs, cache=False)
    for dtype in ("float16", "bfloat16", "float32", "float64", "complex64", "int8"):
        r, a = options.tolerance(dtype)
        assert isinstance(r, float)
        assert isinstance(a, float)
        if rtol is not None:
            assert r == rtol
        if atol is not None:
            assert a == atol


def test_options_tolerance_per_dtype():
    options = LadderOptions()
    assert options.tolerance("float64") == (1e-9, 1e-12)
    assert options.tolerance("float32") == (1e-3, 1e-6)
    assert options.tolerance("bfloat16") == (2e-2, 1e-3)
    assert options.tolerance("float16") == (1e-2, 1e-4)
    # complex numbers are pairs of floats of half their width
    assert options.tolerance("complex128") == options.tolerance("float64")
    assert options.tolerance("complex64") == options.tolerance("float32")
    # the narrower the dtype, the looser the tolerance
    order = ["float64", "float32", "float16", "bfloat16"]
    rtols = [options.tolerance(d)[0] for d in order]
    assert rtols == sorted(rtols)
    # a user's value overrides one of the two only
    assert LadderOptions(rtol=0.5).tolerance("float64") == (0.5, 1e-12)
    assert LadderOptions(atol=0).tolerance("float16") == (1e-2, 0.0)


def test_options_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("DUALTRAIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert LadderOptions().folder() == tmp_path / "xdg" / "dualtrain" / "accelerate"
    assert LadderOptions(cache=True).folder() == default_folder()
    monkeypatch.setenv("DUALTRAIN_CACHE_DIR", str(tmp_path / "dt"))
    assert LadderOptions().folder() == tmp_path / "dt" / "accelerate"
    assert LadderOptions(cache=False).folder() is None
    assert LadderOptions(cache=str(tmp_path / "mine")).folder() == tmp_path / "mine"
    assert LadderOptions(cache=tmp_path / "mine").folder() == tmp_path / "mine"


def test_default_folder_falls_back_to_home(monkeypatch, tmp_path):
    monkeypatch.delenv("DUALTRAIN_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_folder() == Path(tmp_path) / ".cache" / "dualtrain" / "accelerate"
    # empty variables count as unset
    monkeypatch.setenv("DUALTRAIN_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert default_folder() == Path(tmp_path) / ".cache" / "dualtrain" / "accelerate"
