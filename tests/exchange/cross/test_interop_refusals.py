"""convert() on what is not a plain array of a known framework: DLPack producers and
capsules, lazy torch views, dtypes no framework pair carries, byte order, bad devices."""

from __future__ import annotations

import datetime
import gc
import itertools
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

import dualtrain
from dualtrain import ArgumentError, DtypeError, convert, count_copies
from tests.helpers import address, native
from tests.strategies import DTYPES_32, arrays, laid_out, same_bits

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

FRAMEWORKS = ("numpy", "torch", "jax")
PAIRS = list(itertools.product(FRAMEWORKS, FRAMEWORKS))


class Foreign:
    """An array type dualtrain has never heard of: it only forwards the DLPack protocol."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, *args, **kwargs):
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class OldForeign(Foreign):
    """A producer from before DLPack 1.0: no keywords, unversioned capsules."""

    def __dlpack__(self, stream=None):
        return torch.utils.dlpack.to_dlpack(self.array)


def numpy_cannot_export(src, a):
    """NumPy's own __dlpack__ refuses ml_dtypes' bfloat16: no consumer can take such a producer."""
    return src == "numpy" and a.dtype.name == "bfloat16"


def capsule_of(x):
    if isinstance(x, torch.Tensor):
        return torch.utils.dlpack.to_dlpack(x)
    return x.__dlpack__()  # NumPy and JAX hand out an unversioned capsule without keywords


# ---- foreign producers and capsules -----------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@given(a=arrays(dtypes=DTYPES_32))
def test_any_dlpack_producer_converts_like_the_array_it_wraps(src, dst, a):
    x = native(a, src)
    direct = convert(x, to=dst)
    if numpy_cannot_export(src, a):
        with pytest.raises(BufferError, match=r"tree\['w'\] cannot be converted"):
            convert({"w": Foreign(x)}, to=dst)
        return
    with count_copies() as c:
        wrapped = convert({"w": Foreign(x)}, to=dst)["w"]
    assert dualtrain.backend_of(wrapped).name == dst
    assert same_bits(convert(wrapped, to="numpy"), convert(direct, to="numpy"))
    if a.size and address(wrapped) != address(x):
        assert c.copies >= 1  # every copy is counted


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@given(a=arrays(dtypes=DTYPES_32))
def test_dlpack_producers_under_copy_false_share_or_refuse(src, dst, a):
    x = native(a, src)
    with count_copies() as c:
        try:
            y = convert([Foreign(x)], to=dst, copy=False)[0]
        except BufferError as err:
            assert "copy=False, but tree[0]" in str(err) or numpy_cannot_export(src, a)
            return
    assert c.copies == 0
    if a.size:
        assert address(y) == address(x)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@given(a=arrays(dtypes=DTYPES_32))
def test_raw_capsules_convert_to_their_values_and_are_consumed_once(src, dst, a):
    x = native(a, src)
    if numpy_cannot_export(src, a):
        return
    capsule = capsule_of(x)
    y = convert({"c": capsule}, to=dst)["c"]
    assert dualtrain.backend_of(y).name == dst
    assert same_bits(convert(y, to="numpy"), a)
    with pytest.raises(ArgumentError, match=r"tree\['c'\] is a DLPack capsule that was already"):
        convert({"c": capsule}, to=dst)


@pytest.mark.parametrize("dst", ["numpy", "torch"])
def test_a_torch_capsule_is_shared_writable_and_uncopied_as_torch_from_dlpack_does(dst):
    t = torch.arange(8, dtype=torch.float32)
    with count_copies() as c:
        y = convert(torch.utils.dlpack.to_dlpack(t), to=dst)
    assert c.copies == 0 and address(y) == address(t)
    y[0] = 42  # an unversioned capsule cannot carry read-only memory: it is writable
    assert float(t[0]) == 42
    del t
    gc.collect()  # the result keeps the exporter's memory alive
    assert np.array_equal(np.asarray(y), [42, 1, 2, 3, 4, 5, 6, 7])


def test_a_capsule_into_jax_shares_aligned_memory():
    t = torch.arange(64, dtype=torch.float32)  # torch's allocations are 64-byte aligned
    with count_copies() as c:
        j = convert(torch.utils.dlpack.to_dlpack(t), to="jax", copy=False)
    assert c.copies == 0 and address(j) == address(t)


def test_producers_from_before_dlpack_1_are_taken_without_a_copy():
    t = torch.arange(6, dtype=torch.float32)
    with count_copies() as c:
        n = convert(OldForeign(t), to="numpy", copy=False)
    assert c.copies == 0 and address(n) == address(t) and n.flags.writeable


def test_readonly_producers_stay_readonly():
    a = np.arange(4.0)
    a.flags.writeable = False
    n = convert(Foreign(a), to="numpy")
    assert not n.flags.writeable
    with count_copies() as c:
        t = convert(Foreign(a), to="torch")  # torch cannot mark it read-only: a copy
    assert c.copies == 1 and address(t) != address(a)


def test_capsules_that_are_not_dlpack_are_refused_by_path():
    with pytest.raises(ArgumentError, match=r"tree\[1\] is a PyCapsule named b'datetime"):
        convert([0, datetime.datetime_CAPI], to="numpy")


def test_a_producer_that_will_not_export_is_an_error_naming_the_leaf():
    z = torch.tensor([1 + 2j], dtype=torch.complex64).conj()  # torch refuses to export it
    with pytest.raises(BufferError, match=r"tree\['z'\] cannot be converted to numpy"):
        convert({"z": Foreign(z)}, to="numpy")


# ---- torch's lazy views ------------------------------------------------------------------

VIEWS = {
    "conj": lambda: torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj(),
    "neg": lambda: torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj().imag,
}


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("dst", ["numpy", "jax"])
def test_lazy_views_are_copies_counted_and_refused_under_copy_false(view, dst):
    t = VIEWS[view]()
    assert t.is_conj() or t.is_neg()
    with pytest.raises(
        BufferError, match=rf"tree\['t'\] .* {'conjugate' if view == 'conj' else 'negative'} view"
    ):
        convert({"t": t}, to=dst, copy=False)
    with count_copies() as c:
        y = convert({"t": t}, to=dst)["t"]
    assert c.copies == 1 and c.nbytes == t.numel() * t.element_size()
    np.testing.assert_array_equal(np.asarray(y), t.resolve_conj().resolve_neg().numpy())


def test_lazy_views_into_torch_are_the_same_tensor():
    t = VIEWS["conj"]()
    with count_copies() as c:
        assert convert(t, to="torch", copy=False) is t
    assert c.copies == 0


# ---- dtypes no framework pair carries ----------------------------------------------------


def _torch_leaf(kind):
    if kind == "quantized":
        return torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
    if kind == "sparse":
        return torch.ones(2, 2).to_sparse()
    if kind == "nested":
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    return torch.zeros(2, dtype=getattr(torch, kind))


UNCARRIED = [
    *(
        ("torch", k, f"torch tensor of dtype torch.{k}")
        for k in ("float8_e4m3fn", "float8_e5m2", "complex32")
    ),
    ("torch", "quantized", "quantized torch tensor"),
    ("torch", "sparse", "torch sparse_coo tensor"),
    ("torch", "nested", "nested torch tensor"),
    ("jax", "float8_e4m3fn", "JAX array of dtype float8_e4m3fn"),
    ("jax", "int4", "JAX array of dtype int4"),
    ("numpy", "float8_e5m2", "NumPy array of dtype float8_e5m2"),
    ("numpy", "object", "NumPy object array"),
    ("numpy", "<U3", "NumPy str array"),
    ("numpy", "S2", "NumPy bytes array"),
    ("numpy", "f4,i4", "NumPy structured array"),
    ("numpy", "M8[s]", "NumPy datetime array"),
    ("numpy", "m8[s]", "NumPy timedelta array"),
]


def _leaf(framework, kind):
    if framework == "torch":
        return _torch_leaf(kind)
    if framework == "jax":
        return jnp.zeros(2, getattr(jnp, kind))
    if kind.startswith("float8"):
        return np.zeros(2, getattr(ml_dtypes, kind))
    return np.zeros(2, dtype=kind)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns about quantized/nested APIs
@pytest.mark.parametrize("dst", FRAMEWORKS)
@pytest.mark.parametrize(("src", "kind", "what"), UNCARRIED)
def test_uncarried_dtypes_are_refused_naming_the_leaf(src, kind, what, dst):
    leaf = _leaf(src, kind)
    tree = {"x": {"a": [0, "keep", leaf]}}
    if src == dst:  # already there: returned as it is, never half-converted
        assert convert(tree, to=dst)["x"]["a"][2] is leaf
        return
    with pytest.raises(DtypeError, match=rf"tree\['x'\]\['a'\]\[2\] is an? {re.escape(what)}"):
        convert(tree, to=dst)


@pytest.mark.parametrize("dst", FRAMEWORKS)
def test_uncarried_dtypes_behind_dlpack_are_refused_too(dst):
    with pytest.raises(DtypeError, match=r"tree\[0\] is a DLPack export .*float8_e4m3fn"):
        convert([Foreign(jnp.zeros(3, jnp.float8_e4m3fn))], to=dst)


# ---- byte order ---------------------------------------------------------------------------

SWAPPABLE = tuple(d for d in DTYPES_32 if d not in ("bool", "int8", "uint8", "bfloat16"))


@pytest.mark.parametrize("dst", FRAMEWORKS)
@given(case=laid_out(dtypes=SWAPPABLE), data=st.data())
def test_big_endian_arrays_arrive_in_native_order_with_one_counted_copy(dst, case, data):
    a, _ = case
    big = a.astype(a.dtype.newbyteorder(">"))
    with count_copies() as c:
        y = convert({"b": big}, to=dst)["b"]
    assert same_bits(convert(y, to="numpy").astype(a.dtype), a)
    if dst == "numpy":  # NumPy holds any byte order: nothing to do
        assert y is big and c.copies == 0
        return
    assert c.copies >= 1 and convert(y, to="numpy").dtype == a.dtype
    with pytest.raises(BufferError, match=r"tree\['b'\] .* byte order is not native \('>"):
        convert({"b": big}, to=dst, copy=False)


# ---- devices ------------------------------------------------------------------------------


@pytest.mark.parametrize("dst", FRAMEWORKS)
@pytest.mark.parametrize("device", ["gpu:9", "cuda:x", "tpu", "cuda:-1", "cpu:x", 3, True])
def test_bad_device_strings_name_the_argument_before_any_leaf_is_touched(dst, device):
    capsule = torch.utils.dlpack.to_dlpack(torch.ones(2))
    with pytest.raises(ArgumentError, match=re.escape(f"got device={device!r}")) as info:
        convert([capsule], to=dst, device=device)
    assert str(info.value).startswith("device must be")
    assert convert([capsule], to=dst)[0].shape == (2,)  # still unconsumed


@pytest.mark.parametrize("dst", ["torch", "jax"])
def test_devices_may_be_named_as_either_framework_does(dst):
    for device in ("cpu", torch.device("cpu"), jax.devices("cpu")[0] if dst == "jax" else "cpu"):
        with count_copies() as c:
            convert(np.ones(4, np.float32), to=dst, device=device)
        assert c.copies <= 1


# ---- on a GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dst", ["numpy", "torch"])
def test_device_producers_are_shared_or_gathered_with_a_counted_copy(dst):
    t = torch.arange(64, dtype=torch.float32, device="cuda")
    with count_copies() as c:
        y = convert([Foreign(t)], to=dst)[0]
    np.testing.assert_array_equal(convert(y, to="numpy"), np.arange(64))
    if dst == "numpy":
        assert c.copies == 1
        with pytest.raises(BufferError, match=r"copy=False, but tree\[0\]"):
            convert([Foreign(t)], to=dst, copy=False)
    else:
        assert c.copies == 0 and address(y) == address(t)


@pytest.mark.gpu
def test_cuda_lazy_views_count_every_copy():
    t = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64, device="cuda").conj()
    with pytest.raises(BufferError, match=r"conjugate view"):
        convert({"t": t}, to="numpy", copy=False)
    with count_copies() as c:
        y = convert({"t": t}, to="numpy")["t"]
    assert c.copies == 2  # resolved on the GPU, then moved to the host
    np.testing.assert_array_equal(np.asarray(y), [1 - 2j, 3 + 1j])


@pytest.mark.gpu
def test_cuda_devices_out_of_range_are_refused():
    bad = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ArgumentError, match=re.escape(f"got device={bad!r}")):
        convert(np.ones(2), to="torch", device=bad)
