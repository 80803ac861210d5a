"""`compare`: is a candidate's result eager's, within the tolerance of its dtype and kind?"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from dualtrain.accelerate import LadderOptions
from dualtrain.accelerate.compare import compare
from tests.strategies import DTYPES, arrays

OPTIONS = LadderOptions(cache=False)
KINDS = ("output", "grad", "buffer", "param")


def name_for(kind: str, i: int) -> str:
    return f"output[{i}]" if kind == "output" else f"{kind}:w{i}"


def kind_of(name: str) -> str:
    return name.split(":")[0].split("[")[0]


@given(st.lists(arrays(dtypes=DTYPES), min_size=0, max_size=4), st.data())
def test_identical_results_agree_exactly(want, data):
    names = [name_for(data.draw(st.sampled_from(KINDS)), i) for i in range(len(want))]
    verdict = compare(names, want, [w.copy() for w in want], OPTIONS)
    assert verdict.ok, verdict.reason
    assert verdict.max_error == 0.0
    assert verdict.reason == ""


@st.composite
def float_results(draw):
    """Named float arrays (1 to 4), as eager gives them, with finite values."""
    count = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    names, want = [], []
    for i in range(count):
        names.append(name_for(draw(st.sampled_from(KINDS)), i))
        shape = draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
        values = draw(
            st.lists(
                st.floats(-1e3, 1e3, width=32) | st.just(0.0),
                min_size=int(np.prod(shape)),
                max_size=int(np.prod(shape)),
            )
        )
        want.append(np.array(values, dtype=dtype).reshape(shape))
    return names, want


def scale_of(names, want, name):
    """What compare's docstring says: the largest |eager| among arrays of the same kind."""
    kind = kind_of(name)
    return max(
        (float(np.abs(w).max()) for n, w in zip(names, want, strict=True) if kind_of(n) == kind),
        default=0.0,
    )


@given(
    results=float_results(),
    which=st.integers(0, 3),
    where=st.integers(0, 15),
    sign=st.sampled_from([-1.0, 1.0]),
    factor=st.floats(0.0, 0.5) | st.floats(2.0, 50.0),
)
def test_perturbation_within_tolerance_accepted_beyond_rejected(
    results, which, where, sign, factor
):
    names, want = results
    which %= len(want)
    target = names[which]
    rtol, atol = OPTIONS.tolerance(want[which].dtype.name)
    bound = atol + rtol * scale_of(names, want, target)
    got = [w.copy() for w in want]
    flat = got[which].reshape(-1)
    at = where % flat.size
    flat[at] = flat[at] + sign * factor * bound
    verdict = compare(names, want, got, OPTIONS)
    error = max(
        float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max())
        for g, w in zip(got, want, strict=True)
    )
    assert verdict.max_error == pytest.approx(error, rel=1e-12, abs=0)
    if factor <= 0.5:
        assert verdict.ok, verdict.reason
    else:
        assert not verdict.ok
        assert verdict.reason.startswith(target + ":")
        assert "exceeds" in verdict.reason


def test_scale_is_per_kind():
    # the bias before a BatchNorm: a true gradient of 0 that eager computes as noise
    names = ["output[0]", "grad:w", "grad:b", "buffer:mean", "buffer:count"]
    want = [
        np.array([0.5, -0.25], np.float32),
        np.array([[1000.0, -3.0]], np.float32),
        np.zeros(3, np.float32),
        np.zeros(2, np.float32),
        np.array([4.0, 1000.0], np.float32),
    ]
    noisy_bias = [w.copy() for w in want]
    noisy_bias[2] = np.array([1e-2, -3e-2, 0.5], np.float32)  # below 1e-3 * 1000
    assert compare(names, want, noisy_bias, OPTIONS).ok

    # the same noise is wrong when the large gradient is small
    small = [w.copy() for w in want]
    small[1] = np.array([[1.0, -3.0]], np.float32)
    noisy_small = [w.copy() for w in small]
    noisy_small[2] = noisy_bias[2]
    verdict = compare(names, small, noisy_small, OPTIONS)
    assert not verdict.ok
    assert verdict.reason.startswith("grad:b:")

    # kinds do not lend each other scale: a large buffer does not excuse an output
    off_output = [w.copy() for w in want]
    off_output[0] = np.array([0.5, -0.2], np.float32)
    verdict = compare(names, want, off_output, OPTIONS)
    assert not verdict.ok
    assert verdict.reason.startswith("output[0]:")

    # a buffer's noise is measured against buffers, not against the gradients
    noisy_mean = [w.copy() for w in want]
    noisy_mean[3] = np.array([0.5, 0.0], np.float32)
    assert compare(names, want, noisy_mean, OPTIONS).ok  # 0.5 < 1e-3 * 1000 (count)
    no_count = names[:4]
    verdict = compare(no_count, want[:4], noisy_mean[:4], OPTIONS)
    assert not verdict.ok
    assert verdict.reason.startswith("buffer:mean:")


def test_user_tolerance_overrides_the_dtype():
    want, got = [np.array([1.0, 2.0])], [np.array([1.1, 2.0])]
    assert not compare(["output[0]"], want, got, OPTIONS).ok
    assert compare(["output[0]"], want, got, LadderOptions(rtol=0.06, cache=False)).ok
    assert compare(["output[0]"], want, got, LadderOptions(atol=0.11, cache=False)).ok


@pytest.mark.parametrize(
    ("want", "got"),
    [
        (np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)),
        (np.zeros(3, np.float32), np.zeros((1, 3), np.float32)),
        (np.zeros(3, np.float32), np.zeros(3, np.float64)),
        (np.zeros(3, np.float32), np.zeros(3, np.float16)),
        (np.zeros(3, np.int32), np.zeros(3, np.int64)),
        (np.zeros(3, np.int32), np.zeros(3, np.float32)),
        (np.zeros((), np.float32), np.zeros(1, np.float32)),
    ],
    ids=lambda a: f"{a.dtype}{list(a.shape)}",
)
def test_shape_or_dtype_mismatch_rejected(want, got):
    verdict = compare(["output[0]", "grad:x"], [np.ones(2), want], [np.ones(2), got], OPTIONS)
    assert not verdict.ok
    assert verdict.reason.startswith("grad:x:")
    assert str(got.dtype) in verdict.reason and str(want.dtype) in verdict.reason


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "complex64"])
def test_nan_and_infinity_where_eager_has_them(dtype):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    want = np.array([np.nan, np.inf, -np.inf, 1.0]).astype(dt)
    ok = compare(["output[0]"], [want], [want.copy()], OPTIONS)
    assert ok.ok, ok.reason
    assert ok.max_error == 0.0
    for i, value in enumerate([1.0, -np.inf, np.inf, np.nan]):
        got = want.copy()
        got[i] = value  # a number where eager has NaN, the wrong infinity, NaN for a number
        verdict = compare(["output[0]"], [want], [got], OPTIONS)
        assert not verdict.ok, (i, value)
        assert verdict.reason.startswith("output[0]:")
    finite = want.copy()
    finite[3] = np.inf  # an infinity where eager is finite
    assert not compare(["output[0]"], [want], [finite], OPTIONS).ok


def test_nan_does_not_hide_an_error_elsewhere():
    want = np.array([np.nan, 1.0], np.float32)
    got = np.array([np.nan, 2.0], np.float32)
    verdict = compare(["grad:w"], [want], [got], OPTIONS)
    assert not verdict.ok
    assert "grad:w" in verdict.reason
    assert verdict.max_error == 1.0


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int32", "int64", "uint64"])
def test_integers_compared_exactly(dtype):
    want = np.array([0, 1, 1, 0]).astype(dtype)
    assert compare(["buffer:steps"], [want], [want.copy()], OPTIONS).ok
    got = want.copy()
    got[2] = 0
    verdict = compare(["buffer:steps"], [want], [got], OPTIONS)
    assert not verdict.ok
    assert verdict.reason.startswith("buffer:steps:")
    # no tolerance however loose the user's
    loose = LadderOptions(rtol=10.0, atol=10.0, cache=False)
    assert not compare(["buffer:steps"], [want], [got], loose).ok


def test_bfloat16_is_compared_within_its_tolerance():
    # JAX hands bfloat16 results to compare as ml_dtypes arrays (NumPy kind "V")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    want = np.array([1.0, 2.0, 0.0], bf16)
    near = np.array([1.0078125, 2.0, 0.0], bf16)  # one bfloat16 ulp at 1.0
    verdict = compare(["output[0]"], [want], [near], OPTIONS)
    assert verdict.ok, verdict.reason
    assert verdict.max_error == pytest.approx(0.0078125)
    far = np.array([1.25, 2.0, 0.0], bf16)
    verdict = compare(["output[0]"], [want], [far], OPTIONS)
    assert not verdict.ok
    assert "exceeds" in verdict.reason


def test_complex128_gets_float64_tolerance():
    want = np.array([1 + 1j, -2j])
    assert compare(["output[0]"], [want], [want * (1 + 1e-12)], OPTIONS).ok
    assert not compare(["output[0]"], [want], [want * (1 + 1e-5)], OPTIONS).ok


def test_non_numeric_results_compared_exactly():
    want = np.asarray("tensor(3)")
    assert compare(["output[1]"], [want], [np.asarray("tensor(3)")], OPTIONS).ok
    assert not compare(["output[1]"], [want], [np.asarray("tensor(4)")], OPTIONS).ok


@pytest.mark.parametrize(
    ("names", "want", "got"),
    [
        (["output[0]"], [np.ones(2)], []),
        (["output[0]"], [np.ones(2)], [np.ones(2), np.ones(2)]),
        (["output[0]", "grad:w"], [np.ones(2)], [np.ones(2)]),
        ([], [np.ones(2)], [np.ones(2)]),
    ],
)
def test_length_mismatch_rejected(names, want, got):
    verdict = compare(names, want, got, OPTIONS)
    assert not verdict.ok
    assert verdict.max_error == float("inf")
    assert "results" in verdict.reason


def test_empty_and_zero_sized_results_agree():
    assert compare([], [], [], OPTIONS).ok
    empty = np.zeros((0, 3), np.float32)
    verdict = compare(["grad:w"], [empty], [empty.copy()], OPTIONS)
    assert verdict.ok
    assert verdict.max_error == 0.0
