"""convert() within NumPy: the copy contract and argument checks, no framework needed."""

import re

import numpy as np
import pytest
from hypothesis import given

import dualtrain
from dualtrain import convert, count_copies
from tests.strategies import arrays, pytrees, same_bits


@given(a=arrays())
def test_copy_none_and_false_return_the_same_array(a):
    with count_copies() as c:
        assert convert(a, to="numpy") is a
        assert convert(a, to="numpy", copy=False) is a
    assert c.copies == 0


@given(a=arrays())
def test_copy_true_always_copies_once_and_exactly(a):
    with count_copies() as c:
        b = convert(a, to="numpy", copy=True)
    assert c.copies == 1 and c.nbytes == a.nbytes
    assert same_bits(a, b)
    assert dualtrain.is_aligned(b)
    if a.size:
        assert not np.shares_memory(a, b)


@given(tree=pytrees())
def test_non_array_leaves_come_back_untouched(tree):
    out = convert(tree, to="numpy", copy=True)
    for x, y in zip(dualtrain.tree.leaves(tree), dualtrain.tree.leaves(out), strict=True):
        if isinstance(x, np.ndarray):
            assert same_bits(x, y)
        else:
            assert x is y


def test_counters_nest_and_each_sees_its_own_copies():
    a = np.ones(4, np.float32)
    with count_copies() as outer:
        convert(a, to="numpy", copy=True)
        with count_copies() as inner:
            convert([a, a], to="numpy", copy=True)
    assert (outer.copies, inner.copies) == (3, 2)
    assert outer.nbytes == 48


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"to": "tensorflow"},
            "to must be one of 'numpy', 'torch', 'jax', 'cupy'; got to='tensorflow'",
        ),
        ({"to": "numpy", "copy": "yes"}, "copy must be None, True or False; got copy='yes'"),
        (
            {"to": "numpy", "narrow": "maybe"},
            "narrow must be 'warn', 'error' or 'allow'; got narrow='maybe'",
        ),
        ({"to": "numpy", "device": "cuda:0"}, "device must be 'cpu' or None for NumPy arrays"),
        ({"to": ["torch"]}, "to must be one of 'numpy', 'torch', 'jax', 'cupy'; got to=['torch']"),
        ({"to": "numpy", "narrow": {}}, "narrow must be 'warn', 'error' or 'allow'; got narrow={}"),
    ],
)
def test_bad_arguments_get_the_house_message(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        convert(np.ones(2), **kwargs)


def test_numpy_scalars_are_leaves_too():
    out = convert({"s": np.float32(2.5)}, to="numpy", copy=True)
    assert out["s"].shape == () and out["s"] == 2.5


@pytest.mark.parametrize("dtype", ["object", "<U3", ">f4", "M8[s]"])
def test_numpy_arrays_of_any_dtype_stay_numpy_and_copy_on_request(dtype):
    a = np.array([1, 2], dtype=dtype) if dtype != "object" else np.array([1, "x"], dtype=object)
    assert convert({"a": a}, to="numpy")["a"] is a  # nothing to carry: returned as it is
    with count_copies() as c:
        b = convert({"a": a}, to="numpy", copy=True)["a"]
    assert c.copies == 1 and b.dtype == a.dtype and not np.shares_memory(a, b)
    assert np.array_equal(a, b)


def test_python_scalars_and_strings_are_not_mistaken_for_dlpack_producers():
    tree = {"n": 3, "s": "text", "b": b"raw", "none": None, "f": 0.5}
    out = convert(tree, to="numpy")
    assert all(out[k] is tree[k] for k in tree)
