"""A user's callbacks answer the cache's byte count: their answers are checked where they enter.

``sizeof`` returning -1 once drove the ledger negative (50 items of 100 KB held under a
10 KB budget, ``resident_bytes`` -50); text or NaN raised a bare ValueError from ``int()``.
The law: whatever ``sizeof`` answers, ``0 <= resident_bytes <= max_memory_size`` after every
call, and a bad answer is an ArgumentError naming sizeof, the value and what is expected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.errors import ArgumentError
from dualtrain.preload import Preloader
from dualtrain.preload.budget import LocalLedger
from dualtrain.preload.sizes import checked_size, nbytes

_BAD = [-1, -(2**70), True, False, np.bool_(True), 1.5, -1.0, math.nan, math.inf, "100",
        b"1", np.float64(3.25), np.int64(-5), [1], object()]  # fmt: skip
# Whole floats count: `1e6` or `n * 4.0` is how sizes are often computed.
_GOOD = [0, 1, 10**6, 2**70, np.int64(7), np.uint8(3), np.int32(0), 1024.0, 1e6, np.float64(3.0)]


def _id(value: object) -> str:
    """repr, but the same in every xdist worker (an object's repr holds its address)."""
    return type(value).__name__ if type(value) is object else repr(value)


@pytest.mark.parametrize("value", _BAD, ids=_id)
def test_a_bad_sizeof_answer_is_refused_naming_it(value) -> None:
    with pytest.raises(ArgumentError, match=r"sizeof must return an int >= 0 .* returned "):
        nbytes([1, 2], lambda obj: value)


@pytest.mark.parametrize("value", _GOOD, ids=_id)
def test_a_good_sizeof_answer_is_that_many_bytes(value) -> None:
    assert nbytes(np.zeros(3), lambda obj: value) == int(value)
    assert checked_size(None, 1) is None


def test_the_issue_example_never_drives_the_ledger_negative() -> None:
    """50 items of 100 KB under a 10 KB budget, sizeof -1: refused, nothing held."""
    data = [np.zeros(100_000, np.uint8) for _ in range(50)]
    p = Preloader(data, max_memory_size=10_000, preloaded_data=0, sizeof=lambda obj: -1)
    for i in range(50):
        with pytest.raises(ArgumentError, match=r"sizeof\(<ndarray>\) returned -1"):
            p[i]
    stats = p.stats()
    assert stats["resident_bytes"] == 0
    p.close()


def test_a_bad_sizeof_reaches_the_caller_of_an_item_loaded_ahead() -> None:
    """Counted in a loader thread, a bad answer fails that load: `get` raises it, no hang."""
    data = [np.zeros(10, np.uint8) for _ in range(6)]
    p = Preloader(data, max_memory_size=10_000, preloaded_data=4, order=range(6),
                  sizeof=lambda obj: "lots")  # fmt: skip
    for i in range(6):
        with pytest.raises(ArgumentError, match=r"returned 'lots'"):
            p[i]
    assert p.stats()["resident_bytes"] == 0
    p.close()


class _Odd:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_a_negative_nbytes_attribute_and_a_bad_dunder_sizeof_are_refused() -> None:
    with pytest.raises(ArgumentError, match=r"nbytes attribute of a _Odd item .* nbytes=-4"):
        nbytes(_Odd(-4))

    class Liar:
        def __sizeof__(self) -> int:
            return -10

    with pytest.raises(ArgumentError, match=r"Liar.__sizeof__ must return an int >= 0"):
        nbytes(Liar())


def test_the_ledger_refuses_what_would_break_its_law() -> None:
    ledger = LocalLedger(100)
    for n in (-1, True, 1.5):
        with pytest.raises(ArgumentError, match="a ledger counts bytes as an int >= 0"):
            ledger.try_add(n)  # type: ignore[arg-type]
    assert ledger.try_add(60) and not ledger.try_add(41)
    with pytest.raises(ArgumentError, match="cannot give back 61 bytes: it holds 60"):
        ledger.sub(61)
    assert ledger.used == 60


_answers = st.one_of(
    st.none(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=3),
    st.integers(0, 2**20).map(np.int64),
)


@settings(max_examples=40, deadline=None)
@given(
    answers=st.lists(_answers, min_size=1, max_size=12),
    budget=st.integers(0, 3000),
    reads=st.lists(st.integers(0, 11), min_size=1, max_size=30),
    ahead=st.integers(0, 3),
)
def test_the_ledger_law_holds_under_any_sizeof(answers, budget, reads, ahead) -> None:
    """0 <= resident <= budget after every read, whatever sizeof answers; a read raises an
    ArgumentError exactly when its item's answer is neither None nor a whole number >= 0."""
    data = [np.full(i % 5 + 1, i, np.int16) for i in range(len(answers))]
    by_id = {id(a): answers[i] for i, a in enumerate(data)}

    def sizeof(obj):
        return by_id.get(id(obj))

    p = Preloader(data, max_memory_size=budget, preloaded_data=ahead, sizeof=sizeof,
                  order=range(len(data)), copy=False)  # fmt: skip
    try:
        for r in reads:
            i = r % len(data)
            told = answers[i]
            whole_float = (
                isinstance(told, (float, np.floating))
                and math.isfinite(told)
                and float(told).is_integer()
            )
            good = told is None or (
                (isinstance(told, (int, np.integer)) or whole_float)
                and not isinstance(told, bool)
                and told >= 0
            )
            if good:
                assert p[i] is data[i]
            else:
                with pytest.raises(ArgumentError, match="sizeof must return"):
                    p[i]
            stats = p.stats()
            assert 0 <= stats["resident_bytes"] <= budget
            assert stats["peak_resident_bytes"] <= budget
    finally:
        p.close()
