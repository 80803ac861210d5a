"""The shared cache pickles framework arrays the fast way, and they come back the same."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from dualtrain.preload.pickling import dumps
from dualtrain.preload.shared import SharedStore

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.float32, torch.float64, torch.complex64, torch.bfloat16]  # fmt: skip


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> None:
    assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
    assert a.requires_grad == b.requires_grad
    assert torch.equal(a.detach(), b.detach())


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 5), max_size=3),
    transpose=st.booleans(),
    kind=st.sampled_from(["tensor", "parameter", "grad"]),
)
def test_tensors_come_back_equal_in_type_dtype_shape_and_values(dtype, shape, transpose, kind):
    t = (torch.arange(int(np.prod(shape)), dtype=torch.float64) % 7).to(dtype).reshape(shape)
    if transpose and t.dim() >= 2:
        t = t.transpose(0, 1)  # not contiguous
    if kind != "tensor" and dtype.is_floating_point:
        t = torch.nn.Parameter(t) if kind == "parameter" else t.clone().requires_grad_(True)
    back = pickle.loads(dumps({"t": t, "n": 3}))
    same_tensor(t, back["t"])
    assert back["n"] == 3


def test_plain_cpu_tensors_travel_as_numpy_bytes_others_as_torch_pickles():
    plain = dumps(torch.ones(4, 4))
    assert b"dualtrain_torch.preload" in plain and b"_from_numpy" in plain
    assert b"dualtrain_torch.preload" not in dumps(torch.ones(2, dtype=torch.bfloat16))
    # A Parameter keeps torch's own rebuild around its data, which goes the fast way.
    parameter = dumps(torch.nn.Parameter(torch.ones(2)))
    assert b"_rebuild_parameter" in parameter and b"_from_numpy" in parameter


def test_the_store_serves_the_fast_pickle(tmp_path):
    store = SharedStore.create(1 << 20, 0)
    try:
        item = {"image": torch.randint(0, 255, (3, 8, 8), dtype=torch.uint8), "label": 2}
        assert store.write(5, item)
        found, back = store.read(5)
        assert found
        same_tensor(item["image"], back["image"])
        back["image"][0, 0, 0] += 1  # writable, and its own memory
        assert back["label"] == 2
    finally:
        store.remove()


def test_jax_arrays_keep_their_own_pickle():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(6.0).reshape(2, 3)
    back = pickle.loads(dumps([x]))[0]
    assert type(back) is type(x) and back.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(back), np.asarray(x))
