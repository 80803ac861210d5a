"""Top-k backprop's framework-free part: choosing k, describing it, the NumPy reference.

`dense_cases` and `reference_grads` are shared with the torch, JAX and cross tests: a dense
layer's input, weight, bias and upstream gradient, and the gradients the hand-written
reference says top-k backprop must give.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from dualtrain.accelerate.topk import DEFAULT_RATIO, Approximation, resolve_k, topk_reference
from dualtrain.errors import ArgumentError


def distinct_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values whose magnitudes differ within each row (no ties: torch.topk has no tie rule)."""
    ranks = np.argsort(rng.random(shape), axis=-1) + 1.0  # a permutation of 1..n per row
    signs = rng.choice([-1.0, 1.0], size=shape)
    scale = rng.uniform(0.25, 2.0, size=(*shape[:-1], 1))
    return signs * ranks * scale


@dataclasses.dataclass
class DenseCase:
    x: np.ndarray  # [..., in]
    weight: np.ndarray  # (out, in)
    bias: np.ndarray | None  # (out,)
    grad: np.ndarray  # [..., out], distinct magnitudes per row
    k: int


# A few fixed layouts for JAX, which compiles each new shape: [in], [B, in], [B, T, in].
FEW_SHAPES = (((), 3, 5), ((4,), 5, 7), ((2, 3), 4, 9), ((3,), 2, 2))


@st.composite
def dense_cases(draw, dense=None, max_out=12, shapes=None) -> DenseCase:
    """A float64 dense layer, 0 to 2 leading axes ([in], [B, in], [B, T, in]), and a k.

    `dense`: True draws k >= out, False k < out (out >= 2), None either. `shapes`: draw
    ``(lead, in, out)`` from these instead of from every small shape.
    """
    if shapes is None:
        lead = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
        n_in = draw(st.integers(1, 6))
        n_out = draw(st.integers(2 if dense is False else 1, max_out))
    else:
        lead, n_in, n_out = draw(st.sampled_from(shapes))
        if dense is False and n_out < 2:
            n_out = 2
    if dense is None:
        k = draw(st.integers(1, n_out + 2))
    elif dense:
        k = draw(st.integers(n_out, n_out + 3))
    else:
        k = draw(st.integers(1, n_out - 1))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bias = rng.normal(size=n_out) if draw(st.booleans()) else None
    return DenseCase(
        rng.normal(size=(*lead, n_in)),
        rng.normal(size=(n_out, n_in)),
        bias,
        distinct_rows(rng, (*lead, n_out)),
        k,
    )


def reference_grads(case: DenseCase) -> dict[str, np.ndarray]:
    """The meProp gradients by hand: sparsified for input and weight, dense for the bias."""
    n_out, n_in = case.weight.shape
    kept = topk_reference(case.grad, case.k)
    out = {
        "x": kept @ case.weight,
        "weight": kept.reshape(-1, n_out).T @ case.x.reshape(-1, n_in),
    }
    if case.bias is not None:
        out["bias"] = case.grad.reshape(-1, n_out).sum(0)
    return out


# resolve_k


def test_nebulgym_small_heads_get_k_1_not_0():
    # round(0.04 * out) is 0 for out <= 12: nebulgym then sent no gradient upstream.
    assert [resolve_k(n) for n in range(13)] == [1] * 13
    assert resolve_k(300) == 12
    assert resolve_k(2048) == 82


@given(features=st.integers(0, 10_000), ratio=st.floats(1e-6, 1.0))
def test_k_from_a_ratio_is_never_0(features, ratio):
    k = resolve_k(features, ratio=ratio)
    assert k >= 1
    assert k == max(1, round(ratio * features))
    assert k <= max(1, features)


@given(features=st.integers(0, 100), k=st.integers(1, 1000))
def test_a_given_k_is_returned_as_is_even_past_the_features(features, k):
    assert resolve_k(features, k=k) == k
    assert resolve_k(features, k=np.int64(k)) == k


def test_the_default_ratio_is_mepropss():
    assert DEFAULT_RATIO == 0.04
    assert resolve_k(1000) == resolve_k(1000, ratio=0.04) == 40
    assert resolve_k(7, ratio=1.0) == 7


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "3", 2.0])
def test_a_bad_k_names_itself(k):
    with pytest.raises(ArgumentError, match=rf"k must be an int >= 1; got k={k!r}"):
        resolve_k(10, k=k)


@pytest.mark.parametrize("ratio", [0, 0.0, -0.1, 1.5, math.nan, math.inf, True, "0.1"])
def test_a_bad_ratio_names_itself(ratio):
    with pytest.raises(ArgumentError, match=r"ratio must be a number in \(0, 1\]; got ratio="):
        resolve_k(10, ratio=ratio)


def test_k_and_ratio_together_are_refused():
    with pytest.raises(ArgumentError, match=r"ratio must be None when k is given.*got ratio=0\.5"):
        resolve_k(10, k=2, ratio=0.5)


@pytest.mark.parametrize("features", [-1, 2.5, None])
def test_bad_features_are_refused(features):
    with pytest.raises(ArgumentError, match="features must be an int >= 0"):
        resolve_k(features)


# Approximation


def test_an_approximation_says_what_it_does():
    approx = Approximation("fc1", 300, 12)
    assert not approx.dense
    assert (
        approx.describe() == "fc1: top-12 of 300 output gradients per sample (meProp, approximate)"
    )
    exact = Approximation("head", 2, 5)
    assert exact.dense
    assert exact.describe() == "head: dense (k=5 >= 2 features, exact)"
    assert Approximation("", 4, 4).describe() == "(root): dense (k=4 >= 4 features, exact)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        approx.k = 3  # type: ignore[misc]


# topk_reference


@given(case=dense_cases())
def test_the_reference_keeps_each_rows_k_largest_magnitudes(case):
    g = case.grad
    got = topk_reference(g, case.k)
    assert got.shape == g.shape and got.dtype == g.dtype
    n = g.shape[-1]
    rows, flat = got.reshape(-1, n), g.reshape(-1, n)
    for kept, row in zip(rows, flat, strict=True):
        keep = min(case.k, n)
        threshold = np.sort(np.abs(row))[::-1][keep - 1]
        want = np.where(np.abs(row) >= threshold, row, 0.0)  # magnitudes are distinct
        np.testing.assert_array_equal(kept, want)
        assert np.count_nonzero(kept) == keep


@given(case=dense_cases(dense=True))
def test_the_reference_is_the_identity_when_k_reaches_the_features(case):
    got = topk_reference(case.grad, case.k)
    np.testing.assert_array_equal(got, case.grad)
    assert got is not case.grad  # a copy: the caller's array is never handed back to write


def test_the_reference_breaks_ties_toward_the_lower_index():
    g = np.array([[1.0, -3.0, 3.0, 2.0, -3.0]])
    np.testing.assert_array_equal(topk_reference(g, 2), [[0.0, -3.0, 3.0, 0.0, 0.0]])


def test_the_reference_handles_3d_and_leaves_its_input_alone():
    g = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 11.5
    before = g.copy()
    got = topk_reference(g, 1)
    np.testing.assert_array_equal(g, before)
    assert got.shape == (2, 3, 4)
    assert (np.count_nonzero(got, axis=-1) == 1).all()


def test_the_reference_refuses_bad_arguments():
    with pytest.raises(ArgumentError, match="k must be an int >= 1; got k=0"):
        topk_reference(np.ones((2, 3)), 0)
    with pytest.raises(ArgumentError, match="grad_out must be an array of at least one axis"):
        topk_reference(np.float64(1.0), 1)
