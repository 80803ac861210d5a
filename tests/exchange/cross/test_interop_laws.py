"""Laws of convert() between every pair of NumPy, torch and JAX, against the NumPy original."""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

import dualtrain
from dualtrain import convert, count_copies
from tests.exchange.cross.test_interop_refusals import Foreign
from tests.helpers import address, native
from tests.strategies import DTYPES_32, DTYPES_64, arrays, laid_out, pytrees, same_bits

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

FRAMEWORKS = ("numpy", "torch", "jax")
PAIRS = list(itertools.product(FRAMEWORKS, FRAMEWORKS))
CROSS_PAIRS = [(s, d) for s, d in PAIRS if s != d]


def x64_if(*frameworks):
    return jax.enable_x64(True) if "jax" in frameworks else contextlib.nullcontext()


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@given(a=arrays(dtypes=DTYPES_32))
def test_round_trip_through_every_pair_is_bit_exact(src, dst, a):
    x = native(a, src)
    y = convert(x, to=dst)
    assert dualtrain.backend_of(y).name == dst
    assert same_bits(convert(y, to="numpy"), a)
    assert same_bits(convert(convert(y, to=src), to="numpy"), a)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@given(a=arrays(dtypes=DTYPES_64))
def test_64_bit_dtypes_round_trip_bit_exact_when_jax_has_x64(src, dst, a):
    with x64_if(src, dst):
        y = convert(native(a, src), to=dst)
        assert same_bits(convert(y, to="numpy"), a)


@pytest.mark.parametrize(("src", "dst"), CROSS_PAIRS)
@given(a=arrays(dtypes=DTYPES_32))
def test_zero_copy_where_promised(src, dst, a):
    """Aligned, contiguous, writable arrays cross without a copy and share memory."""
    x = native(a, src)
    numpy_bf16_into_jax = src == "numpy" and dst == "jax" and a.dtype.name == "bfloat16"
    # Torch cannot mark memory read-only: an immutable JAX buffer is shared only on request.
    copy = False if (src, dst) == ("jax", "torch") else None
    with count_copies() as c:
        y = convert(x, to=dst, copy=copy)
    if numpy_bf16_into_jax:  # NumPy's DLPack export refuses ml_dtypes' bfloat16
        assert c.copies == 1
        return
    assert c.copies == 0
    if a.size:
        assert address(y) == address(x)


@pytest.mark.parametrize("dst", ["torch", "jax"])
@given(case=laid_out())
def test_copy_false_never_copies(dst, case):
    a, _ = case
    with count_copies() as c:
        try:
            y = convert(a, to=dst, copy=False)
        except BufferError as err:
            assert "copy=False" in str(err)
            return
    assert c.copies == 0
    if a.size:
        assert address(y) == address(a)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@given(a=arrays(dtypes=DTYPES_32))
def test_copy_true_always_copies(src, dst, a):
    x = native(a, src)
    with count_copies() as c:
        y = convert(x, to=dst, copy=True)
    assert c.copies >= 1
    assert same_bits(convert(y, to="numpy"), a)
    if a.size:
        assert address(y) != address(x)


# What each awkward layout costs on the way in: copies made with copy=None.
EXPECTED_COPIES = {
    ("torch", "plain"): 0, ("torch", "reversed"): 1, ("torch", "strided"): 0,
    ("torch", "transposed"): 0, ("torch", "misaligned"): 0, ("torch", "readonly"): 1,
    ("jax", "plain"): 0, ("jax", "reversed"): 1, ("jax", "strided"): 1,
    ("jax", "transposed"): 0, ("jax", "misaligned"): 1, ("jax", "readonly"): 1,
}  # fmt: skip


@pytest.mark.parametrize("dst", ["torch", "jax"])
@given(case=laid_out(dtypes=tuple(d for d in DTYPES_32 if d != "bfloat16")))
def test_awkward_layouts_convert_exactly_with_counted_copies(dst, case):
    a, layout = case
    with count_copies() as c:
        y = convert(a, to=dst)
    assert same_bits(convert(y, to="numpy"), a)
    expected = EXPECTED_COPIES[dst, layout]
    if layout in ("reversed", "strided", "transposed") and a.flags.c_contiguous:
        # Degenerate (size-1 axes): no element uses their strides, so neither framework copies.
        expected = 0
    assert c.copies == expected


def test_non_row_major_jax_arrays_are_counted_when_numpy_must_copy_them():
    base = dualtrain.aligned_empty((3, 4), np.float32)
    base[...] = np.arange(12).reshape(3, 4)
    j = convert(base.T, to="jax", copy=False)  # JAX keeps the transposed layout, no copy
    assert address(j) == address(base)
    with count_copies() as c:
        n = convert(j, to="numpy")
    assert np.array_equal(n, base.T)
    assert c.copies == (0 if address(n) == address(j) else 1)
    if c.copies:
        with pytest.raises(BufferError, match="not row-major"):
            convert(j, to="numpy", copy=False)


def test_negative_strides_never_reach_torch_from_dlpack():
    # torch.from_dlpack aborts the whole process on a negative stride; convert copies first.
    a = np.arange(12.0, dtype=np.float32).reshape(3, 4)[::-1, ::-1]
    t = convert(a, to="torch")
    assert torch.equal(t, torch.from_numpy(a.copy()))


@pytest.mark.parametrize("make", ["jax", "readonly numpy"])
def test_immutable_sources_reach_torch_as_copies_unless_copy_false(make):
    a = np.arange(6, dtype=np.float32)
    src = jnp.asarray(a) if make == "jax" else a.copy()
    if make == "readonly numpy":
        src.flags.writeable = False
    with count_copies() as c:
        t = convert(src, to="torch")
    assert c.copies == 1 and address(t) != address(src)
    t.add_(1)  # an ordinary tensor: writing it leaves the immutable source alone
    assert np.array_equal(np.asarray(src), a)
    with count_copies() as c:
        shared = convert(src, to="torch", copy=False)  # the caller promises not to write
    assert c.copies == 0 and address(shared) == address(src)
    assert torch.equal(shared, torch.arange(6.0))


def test_jax_arrays_reach_numpy_read_only():
    n = convert(jnp.arange(4.0), to="numpy")
    assert not n.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        n[0] = 1


def test_tensors_that_require_grad_export_detached_without_copy():
    t = torch.arange(4.0, requires_grad=True)
    with count_copies() as c:
        j = convert(t, to="jax")
        n = convert(t, to="numpy")
    assert c.copies == 0
    assert address(j) == address(t) == address(n)
    assert np.array_equal(np.asarray(j), [0, 1, 2, 3])


def test_conjugate_views_are_resolved():
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()
    assert np.array_equal(np.asarray(convert(z, to="jax")), [1 - 2j, 3 + 1j])


class TestX64Off:
    """JAX without x64 would narrow 64-bit leaves silently; convert never does."""

    def test_int64_that_fits_narrows_exactly_with_one_copy(self):
        a = np.array([-(2**31), 0, 2**31 - 1], dtype=np.int64)
        with count_copies() as c:
            j = convert(a, to="jax")
        assert j.dtype == jnp.int32 and c.copies == 1
        assert np.array_equal(np.asarray(j), a)

    def test_int64_that_does_not_fit_raises_naming_the_leaf(self):
        with pytest.raises(
            dualtrain.DtypeError, match=r"tree\['ids'\] is int64 .* do not fit int32"
        ):
            convert({"ids": np.array([2**40])}, to="jax")

    def test_float64_narrows_with_a_warning_by_default(self):
        a = np.array([0.1, 1e-30], dtype=np.float64)
        with pytest.warns(dualtrain.PrecisionWarning) as record:
            j = convert([a, a], to="jax")[1]
        assert [str(w.message).split(" is ")[0] for w in record] == ["tree[0]", "tree[1]"]
        assert np.array_equal(np.asarray(j), a.astype(np.float32))

    def test_narrow_error_and_allow(self):
        a = np.ones(3)
        with pytest.raises(dualtrain.DtypeError, match="float64"):
            convert(a, to="jax", narrow="error")
        assert convert(a, to="jax", narrow="allow").dtype == jnp.float32  # no warning: filter=error

    def test_copy_false_refuses_narrowing(self):
        with pytest.raises(BufferError, match="without x64 cannot hold float64"):
            convert(torch.ones(3, dtype=torch.float64), to="jax", copy=False, narrow="allow")

    def test_with_x64_on_nothing_narrows_or_copies(self):
        with jax.enable_x64(True), count_copies() as c:
            j = convert(torch.ones(3, dtype=torch.float64), to="jax")
        assert j.dtype == jnp.float64 and c.copies == 0


@pytest.mark.parametrize(("first", "second"), [("torch", "jax"), ("jax", "torch")])
@given(tree=pytrees(leaves=st.one_of(arrays(dtypes=DTYPES_32), st.integers(), st.none())))
def test_pytrees_keep_structure_and_leaves_through_both_frameworks(first, second, tree):
    out = convert(convert(convert(tree, to=first), to=second), to="numpy")
    ins, outs = dualtrain.tree.leaves(tree), dualtrain.tree.leaves(out)
    assert len(ins) == len(outs)
    for x, y in zip(ins, outs, strict=True):
        if isinstance(x, np.ndarray):
            assert same_bits(x, y)
        else:
            assert x is y
    assert type(out) is type(tree)


def test_device_argument_moves_only_when_needed():
    a = dualtrain.aligned_empty(8, np.float32)
    a[:] = 1
    with count_copies() as c:
        assert address(convert(a, to="torch", device="cpu")) == address(a)
        assert address(convert(a, to="jax", device="cpu")) == address(a)
    assert c.copies == 0


@pytest.mark.multidevice
def test_device_argument_places_jax_arrays_and_counts_the_move():
    target = jax.devices()[2]
    a = dualtrain.aligned_copy(np.ones(4, np.float32))
    with count_copies() as c:
        j = convert(a, to="jax", device=target)
    assert j.devices() == {target}
    assert c.copies == 1  # the move to device 2; the aligned buffer itself is shared
    with pytest.raises(BufferError, match="must move to device"):
        convert(jnp.ones(4), to="jax", device=target, copy=False)


@pytest.mark.multidevice
@pytest.mark.parametrize("dst", ["numpy", "torch"])
def test_sharded_jax_arrays_are_gathered_with_one_counted_copy(dst):
    mesh = jax.make_mesh((4,), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    x = jax.device_put(jnp.arange(16.0).reshape(8, 2), sharding)
    with count_copies() as c:
        y = convert(x, to=dst)
    assert c.copies == 1
    assert np.array_equal(convert(y, to="numpy"), np.arange(16.0).reshape(8, 2))
    with pytest.raises(BufferError, match="not in one host buffer"):
        convert(x, to=dst, copy=False)


def test_backend_of_finds_each_framework_and_refuses_mixtures():
    assert dualtrain.backend_of(torch.ones(1)).name == "torch"
    assert dualtrain.backend_of(jnp.ones(1)).name == "jax"
    with pytest.raises(dualtrain.BackendError, match=r"one framework; got \['jax', 'torch'\]"):
        dualtrain.backend_of(torch.ones(1), jnp.ones(1))


def test_backend_of_sees_jax_tracers_under_jit_grad_and_vmap():
    seen = []

    def f(x):
        seen.append(dualtrain.backend_of(x).name)
        return (x * x).sum()

    jax.jit(f)(jnp.ones(3))
    jax.grad(f)(jnp.ones(3))
    jax.vmap(f)(jnp.ones((2, 3)))
    assert seen == ["jax", "jax", "jax"]


@pytest.mark.gpu
@pytest.mark.parametrize(("src", "dst"), [("torch", "jax"), ("jax", "torch")])
def test_cuda_arrays_cross_without_copy(src, dst):
    a = np.arange(1024, dtype=np.float32)
    x = convert(a, to=src, device="cuda:0")
    # JAX memory is immutable and torch cannot mark memory read-only (design rule 10):
    # JAX -> torch copies under copy=None, once and counted, and shares under copy=False.
    with count_copies() as c:
        y = convert(x, to=dst, copy=False if src == "jax" else None)
    assert c.copies == 0 and address(y) == address(x)
    assert np.array_equal(convert(y, to="numpy"), a)
    with count_copies() as c:
        convert(x, to=dst)
    assert c.copies == (1 if src == "jax" else 0)


@pytest.mark.gpu
def test_pinned_host_tensors_reach_jax():
    t = torch.arange(256, dtype=torch.float32).pin_memory()
    j = convert(t, to="jax")
    assert np.array_equal(np.asarray(j), np.arange(256))


@pytest.mark.gpu
def test_cupy_round_trip():
    cupy = pytest.importorskip("cupy")
    a = np.arange(64, dtype=np.float32)
    c = convert(a, to="cupy")
    assert isinstance(c, cupy.ndarray)
    t = convert(c, to="torch")
    assert address(t) == int(c.data.ptr)
    assert np.array_equal(convert(t, to="numpy"), a)


# ---- every stride layout: converted exactly, or refused in the house form -----------------

STRIDE_DTYPES = ("bool", "uint8", "int16", "int32", "float16", "bfloat16", "float32")


@st.composite
def strided_views(draw):
    """A NumPy view of any layout: size-1 and empty axes with any stride, zero, negative and
    non-multiple-of-itemsize strides, 0-d, misaligned starts, read-only; or a view made by
    slicing and transposing, or by broadcast_to."""
    dtype = dualtrain.dtypes.numpy_dtype(draw(st.sampled_from(STRIDE_DTYPES)))
    k = dtype.itemsize
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    how = draw(st.sampled_from(["as_strided", "slice", "broadcast"]))
    if how == "as_strided":
        strides = tuple(draw(st.integers(-3 * k, 3 * k)) for _ in shape)
        reach = [(n - 1) * s for n, s in zip(shape, strides, strict=True) if n]
        low = sum(r for r in reach if r < 0) if 0 not in shape else 0
        high = sum(r for r in reach if r > 0) if 0 not in shape else 0
        start = draw(st.integers(0, k))  # misaligned starts too
        size = high - low + k + start
        raw = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), np.uint8).copy()
        if dtype == np.bool_:
            raw &= 1  # a bool byte holds 0 or 1
        view = np.ndarray(shape, dtype, buffer=raw, offset=start - low, strides=strides)
    elif how == "broadcast":
        small = tuple(draw(st.sampled_from([1, n])) for n in shape)
        view = np.broadcast_to(draw(arrays(dtypes=(dtype.name,), shape=st.just(small))), shape)
    else:
        base = draw(arrays(dtypes=(dtype.name,), shape=st.just(tuple(2 * n + 1 for n in shape))))
        steps = tuple(draw(st.sampled_from([1, 2, -1, -2])) for _ in shape)
        view = base[(*(slice(None, None, s) for s in steps), ...)]
        view = view[(*(slice(0, n) for n in shape), ...)]  # `...`: 0-d stays an array
        view = view.T if draw(st.booleans()) else view
    if draw(st.booleans()):
        view.flags.writeable = False
    return view


def source_of(view, src):
    """`view` as an array of `src`, keeping its layout where `src` can hold it."""
    if src == "producer":
        assume(view.dtype.name != "bfloat16")  # NumPy's __dlpack__ refuses ml_dtypes' types
        return Foreign(view)  # a DLPack producer dualtrain has never heard of
    if src == "torch" and view.dtype.name != "bfloat16" and view.flags.writeable:
        try:  # torch counts strides in elements and has no negative ones
            return torch.from_numpy(view)
        except (ValueError, TypeError):
            pass
    return view if src == "numpy" else convert(view, to=src)


@pytest.mark.parametrize(("src", "dst"), [*PAIRS, *(("producer", d) for d in FRAMEWORKS)])
@given(view=strided_views(), copy=st.sampled_from([None, True, False]))
def test_any_stride_layout_round_trips_exactly_or_is_refused_by_convert(src, dst, view, copy):
    expected = np.array(view)  # the values, copied out first
    x = source_of(view, src)
    with count_copies() as c:
        try:
            y = convert(x, to=dst, copy=copy)
        except BufferError as err:  # the copy contract, worded by convert, naming the leaf
            assert copy is False, err
            assert str(err).startswith("copy=False, but tree cannot be converted"), err
            assert c.copies == 0
            return
    assert dualtrain.backend_of(y).name == dst
    assert same_bits(convert(y, to="numpy"), expected)
    assert c.copies == 0 if copy is False else c.copies >= (1 if copy else 0)


@pytest.mark.parametrize("dst", ["torch", "jax"])
@pytest.mark.parametrize("strides", [(4, 3), (4, -4), (4, 10**6), (4, 0)])
def test_strides_of_size_1_axes_are_never_a_reason_to_copy_or_refuse(dst, strides):
    # torch.from_numpy refused a size-1 axis with an odd stride with its own ValueError.
    base = dualtrain.aligned_empty((8,), np.float32)
    base[...] = np.arange(8)
    a = np.lib.stride_tricks.as_strided(base, shape=(3, 1), strides=strides)
    with count_copies() as c:
        y = convert(a, to=dst, copy=False)
    assert c.copies == 0
    assert address(y) == address(a)
    assert np.array_equal(convert(y, to="numpy"), a)


@pytest.mark.parametrize("dst", ["torch", "jax"])
def test_empty_arrays_with_any_strides_convert(dst):
    base = np.zeros(8, np.float32)
    for shape, strides in [((0, 3), (7, 3)), ((3, 0), (-7, 3)), ((0,), (-1,))]:
        a = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides)
        with count_copies() as c:
            y = convert(a, to=dst, copy=False)
        assert tuple(y.shape) == shape
        assert c.copies == 0


@pytest.mark.parametrize("dst", ["torch", "jax"])
def test_strides_off_the_itemsize_are_copied_or_refused_naming_the_layout(dst):
    base = np.arange(16, dtype=np.float32)
    a = np.lib.stride_tricks.as_strided(base, shape=(3, 2), strides=(8, 2))
    with count_copies() as c:
        y = convert(a, to=dst)
    assert c.copies == 1
    assert np.array_equal(convert(y, to="numpy"), a)
    with pytest.raises(BufferError, match=r"strides \(8, 2\) bytes, itemsize 4"):
        convert({"w": a}, to=dst, copy=False)


@pytest.mark.parametrize("dst", ["numpy", "jax"])
def test_torch_layouts_numpy_cannot_make_reach_every_framework(dst):
    t = torch.arange(6.0)
    odd = t.as_strided((2, 1, 3), (3, 7, 1))  # a size-1 axis with any element stride
    wide = torch.arange(3.0).expand(4, 3)  # zero strides
    empty = t.as_strided((0, 2), (5, 3))
    for x in (odd, wide, empty, t[5], t.view(2, 3).T):
        y = convert(x, to=dst)
        assert np.array_equal(convert(y, to="numpy"), x.numpy())
