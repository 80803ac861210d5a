"""Every backend's verbs agree with the NumPy backend: the contract the core builds on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import dualtrain
from dualtrain import convert
from tests.helpers import address

rows = hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 8), st.integers(0, 4)),
    elements=st.floats(-1e3, 1e3, width=32),
)


def test_each_backend_satisfies_the_protocol(backend):
    assert isinstance(backend, dualtrain.Backend)
    assert dualtrain.load(backend.name) is backend


@given(table=rows, data=st.data())
def test_take_rows_and_put_rows_match_numpy(backend, table, data):
    n = table.shape[0]
    idx = np.asarray(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=6)), np.int32)
    x, i = convert(table, to=backend.name, copy=True), convert(idx, to=backend.name)
    assert np.array_equal(convert(backend.take_rows(x, i), to="numpy"), table[idx])
    unique = np.unique(idx)
    values = np.full((unique.size, table.shape[1]), 7.0, np.float32)
    out = backend.put_rows(x, convert(unique, to=backend.name), convert(values, to=backend.name))
    expected = table.copy()
    expected[unique] = 7.0
    assert np.array_equal(convert(out, to="numpy"), expected)


@given(
    arrays=st.lists(hnp.arrays(np.int32, (3, 2)), min_size=1, max_size=4), axis=st.integers(0, 2)
)
def test_stack_matches_numpy(backend, arrays, axis):
    xs = [convert(a, to=backend.name) for a in arrays]
    assert np.array_equal(convert(backend.stack(xs, axis=axis), to="numpy"), np.stack(arrays, axis))


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "bfloat16"])
def test_zeros(backend, dtype):
    z = convert(backend.zeros((2, 3), dtype), to="numpy")
    assert z.shape == (2, 3) and z.dtype.name == dtype and not z.astype(np.float32).any()


def test_copy_is_separate_and_detached(backend):
    x = convert(np.arange(4, dtype=np.float32), to=backend.name, copy=True)
    y = backend.copy(x)
    assert address(y) != address(x)
    assert np.array_equal(convert(y, to="numpy"), np.arange(4))


def test_device_verbs_on_the_host(backend):
    x = convert(np.ones(3, np.float32), to=backend.name)
    assert backend.device_of(x) == "cpu"
    assert backend.same_device(x, "cpu") and backend.same_device(x, None)
    put = backend.device_put(x, "cpu")  # already there: the same memory comes back
    assert address(put) == address(x)
    assert np.array_equal(convert(put, to="numpy"), np.ones(3))
    assert backend.is_contiguous(backend.exportable(x))
    assert backend.owns(x) and not backend.owns([1.0])
