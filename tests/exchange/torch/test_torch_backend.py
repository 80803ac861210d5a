"""Torch-only behaviour of the adapter."""

import numpy as np
import pytest

import dualtrain
from dualtrain import convert
from tests.helpers import address

torch = pytest.importorskip("torch")


def test_bfloat16_tensors_view_as_ml_dtypes_without_copy():
    t = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    n = dualtrain.load("torch").to_numpy(t)
    assert n.dtype.name == "bfloat16" and address(n) == address(t)
    assert np.array_equal(n.astype(np.float32), [1.5, -2.0, 3.25])
    back = convert(n, to="torch")
    assert back.dtype == torch.bfloat16 and address(back) == address(t)


def test_numpy_and_torch_share_writable_memory_both_ways():
    a = np.zeros(3, np.float32)
    t = convert(a, to="torch")
    t[0] = 5
    assert a[0] == 5
    n = convert(t, to="numpy")
    n[1] = 6
    assert float(t[1]) == 6


def test_gapped_strides_reach_torch_without_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    with dualtrain.count_copies() as c:
        t = convert(a, to="torch")
    assert c.copies == 0 and t.stride() == (4, 2)
    assert np.array_equal(t.numpy(), a)


def test_torch_views_export_their_strides_to_numpy():
    t = torch.arange(12.0).reshape(3, 4).T
    n = convert(t, to="numpy")
    assert address(n) == address(t) and np.array_equal(n, t.numpy())
