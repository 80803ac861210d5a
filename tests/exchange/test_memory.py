import gc

import numpy as np
import pytest
from hypothesis import given
from hypothesis.extra import numpy as hnp

from dualtrain import aligned_copy, aligned_empty, is_aligned
from tests.strategies import DTYPES, arrays, np_dtype, same_bits, shapes, strategies_sampled


@given(shape=shapes, dtype=strategies_sampled(DTYPES))
def test_aligned_empty_is_aligned_contiguous_and_writable(shape, dtype):
    a = aligned_empty(shape, np_dtype(dtype))
    assert a.shape == shape
    assert a.dtype == np_dtype(dtype)
    assert a.flags.c_contiguous
    assert a.flags.writeable
    assert is_aligned(a)


@given(a=arrays())
def test_aligned_copy_is_equal_aligned_and_separate(a):
    b = aligned_copy(a)
    assert is_aligned(b)
    assert same_bits(a, b)
    if a.size:
        assert not np.shares_memory(a, b)


@given(a=hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=2)))
def test_aligned_copy_of_a_view_makes_it_contiguous(a):
    view = a[::-1, ::2]
    b = aligned_copy(view)
    assert b.flags.c_contiguous
    assert np.array_equal(b, view, equal_nan=True)


def test_negative_shape_is_refused_with_the_house_message():
    with pytest.raises(
        ValueError, match=r"shape must be a tuple of non-negative ints; got shape=\(2, -1\)"
    ):
        aligned_empty((2, -1))


@given(shape=shapes, dtype=strategies_sampled(DTYPES))
def test_an_aligned_array_outlives_every_other_reference_to_its_memory(shape, dtype):
    a = aligned_empty(shape, np_dtype(dtype))
    raw = a.reshape(-1).view(np.uint8)
    raw[...] = 7  # written through its own memory
    del raw
    gc.collect()
    assert a.base is not None and np.all(a.reshape(-1).view(np.uint8) == 7)


@pytest.mark.parametrize(
    ("dtype", "error"),
    [(object, TypeError), ([("a", "O")], TypeError), (("f4", (3,)), ValueError)],
)
def test_dtypes_a_byte_buffer_cannot_hold_as_given_are_refused(dtype, error):
    # Python references over uninitialized bytes would crash the interpreter; a subarray
    # dtype would silently change the shape.
    with pytest.raises(error):
        aligned_empty((2,), dtype)
