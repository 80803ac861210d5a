"""Laws of dualtrain.preload.sizes: exact byte counts, `own` (no pinned buffers), `fresh` copies."""

from __future__ import annotations

import collections
import dataclasses
import gc
import io
import sys
import threading
import weakref
from copy import deepcopy
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from dualtrain import Preloader
from dualtrain.preload.copies import fresh, map_leaves
from dualtrain.preload.sizes import nbytes, own

size = sys.getsizeof


class Pair(NamedTuple):
    left: Any
    right: Any


@dataclasses.dataclass
class Record:
    name: str
    values: Any


@dataclasses.dataclass(slots=True)
class Slotted:
    label: str
    data: Any


def assert_same(a: Any, b: Any) -> None:
    """Equal values and the same types all the way down (NumPy, torch, containers)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            assert_same(getattr(a, field.name), getattr(b, field.name))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        if isinstance(a, collections.defaultdict):
            assert a.default_factory is b.default_factory
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


# -- nbytes: NumPy --------------------------------------------------------------------------

owned_arrays = hnp.arrays(
    st.sampled_from([np.uint8, np.int16, np.int32, np.float32, np.float64, np.complex128]),
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
)


@given(owned_arrays)
def test_owned_array_counts_what_getsizeof_says(a: np.ndarray) -> None:
    a = a.copy()
    assert a.base is None
    assert nbytes(a) == size(a)


def test_a_view_counts_its_header_and_the_whole_base_once() -> None:
    base = np.zeros(1000, dtype=np.float64)
    view = base[10:20]
    assert nbytes(view) == size(view) + base.nbytes
    inner = view[2:4]  # a view of a view pins the same root
    assert nbytes(inner) == size(inner) + base.nbytes


def test_two_views_of_one_base_count_the_base_once() -> None:
    base = np.arange(500, dtype=np.int32)
    a, b = base[:10], base[100:300:2]
    item = [a, b]
    assert nbytes(item) == size(item) + size(a) + size(b) + base.nbytes


@pytest.mark.parametrize("base_first", [True, False])
def test_a_base_and_its_view_together_count_the_buffer_once(base_first: bool) -> None:
    base = np.ones((20, 30))
    view = base[3]
    item = (base, view) if base_first else (view, base)
    assert nbytes(item) == size(item) + size(base) + size(view)


def test_a_view_of_bytes_counts_the_bytes() -> None:
    raw = bytes(4096)
    a = np.frombuffer(raw, dtype=np.uint8)[:16]
    assert nbytes(a) == size(a) + len(raw)


def test_an_object_array_counts_the_objects_it_holds() -> None:
    # Regression: only its pointers were counted, not the strings and lists it pins.
    text, row = "t" * 1000, [10**20, b"raw" * 50]
    a = np.array([text, row, text], dtype=object)
    expected = size(a) + size(text) + size(row) + size(row[0]) + size(row[1])
    assert nbytes(a) == expected
    assert nbytes(a[1:]) == size(a[1:]) + a.nbytes + expected - size(a)  # the base pins all


# -- nbytes: torch, JAX, Pillow ------------------------------------------------------------


def test_torch_tensor_counts_its_storage() -> None:
    t = torch.zeros(300, dtype=torch.float32)
    assert nbytes(t) == size(t) + 1200


def test_torch_views_count_their_storage_once() -> None:
    t = torch.arange(100, dtype=torch.int64)
    v, w = t[5:10], t.view(10, 10)[:, 3]
    assert nbytes(v) == size(v) + 800
    item = [t, v, w]
    assert nbytes(item) == size(item) + size(t) + size(v) + size(w) + 800


def test_separate_torch_tensors_count_each_storage() -> None:
    a, b = torch.zeros(10), torch.zeros(10)
    item = {"a": a, "b": b}
    expected = size(item) + size("a") + size("b") + size(a) + size(b) + 80
    assert nbytes(item) == expected


def test_jax_array_counts_its_bytes_once() -> None:
    a = jnp.zeros((4, 5), dtype=jnp.float32)
    assert nbytes(a) == size(a) + 80
    item = [a, a]
    assert nbytes(item) == size(item) + size(a) + 80


@pytest.mark.parametrize(("mode", "per_pixel"), [("L", 1), ("RGB", 4), ("RGBA", 4)])
def test_pil_image_counts_its_pixels(mode: str, per_pixel: int) -> None:
    im = Image.new(mode, (7, 5))
    assert nbytes(im) == size(im) + 7 * 5 * per_pixel


# -- nbytes: Python objects and containers ---------------------------------------------------


@pytest.mark.parametrize(
    "obj", [b"", b"abc" * 100, "", "text" * 50, "ünï", 0, 7, 2**100, 1.5, None]
)
def test_immutables_count_getsizeof(obj: object) -> None:
    assert nbytes(obj) == size(obj)


def test_nested_containers_count_every_object_once() -> None:
    arr = np.zeros(10)
    inner = ["xy", 123456789, arr]
    item = {"k": inner, "t": (b"raw", 3.25), "s": {10**9, 10**10}}
    expected = (
        size(item)
        + size("k") + size(inner) + size("xy") + size(123456789) + size(arr)
        + size("t") + size(item["t"]) + size(b"raw") + size(3.25)
        + size("s") + size(item["s"]) + size(10**9) + size(10**10)
    )  # fmt: skip
    assert nbytes(item) == expected
    twice = [inner, inner]  # the same list twice: once
    assert nbytes(twice) == size(twice) + nbytes(inner)


def test_namedtuple_ordereddict_and_dataclasses() -> None:
    arr = np.arange(6)
    pair = Pair("left", arr)
    assert nbytes(pair) == size(pair) + size("left") + size(arr)
    od = collections.OrderedDict([("a", arr), ("b", b"x" * 9)])
    assert nbytes(od) == size(od) + size("a") + size(arr) + size("b") + size(od["b"])
    rec = Record("r", [arr])
    fields = vars(rec)
    expected = size(rec) + size(fields) + sum(size(k) for k in fields)
    assert nbytes(rec) == expected + size("r") + size(rec.values) + size(arr)
    slotted = Slotted("s", arr)
    assert nbytes(slotted) == size(slotted) + size("s") + size(arr)


def test_a_list_containing_itself_terminates() -> None:
    item: list[Any] = [b"payload" * 10]
    item.append(item)
    assert nbytes(item) == size(item) + size(item[0])
    d: dict[str, Any] = {}
    d["self"] = d
    assert nbytes(d) == size(d) + size("self")


def test_sizeof_override_is_asked_first() -> None:
    arr = np.zeros(100)

    def sizeof(obj: object) -> int | None:
        return 1234 if isinstance(obj, np.ndarray) else None

    item = ["a", arr]
    assert nbytes(item, sizeof) == size(item) + size("a") + 1234
    assert nbytes(arr, sizeof) == 1234
    assert nbytes(item, lambda obj: 5) == 5  # the whole item: its contents are not visited


leaves = st.one_of(
    owned_arrays,
    st.binary(max_size=40),
    st.text(max_size=20),
    st.integers(),
    st.builds(torch.tensor, st.lists(st.floats(-1e3, 1e3, width=32), max_size=8)),
)
trees = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.tuples(kids, kids),
        st.dictionaries(st.text(max_size=4), kids, max_size=4),
    ),
    max_leaves=10,
)


@given(trees)
def test_a_repeated_object_is_counted_once(item: Any) -> None:
    twice = [item, item]
    assert nbytes(twice) == size(twice) + nbytes(item)


@given(trees, trees)
def test_counts_are_subadditive(a: Any, b: Any) -> None:
    pair = [a, b]
    assert max(nbytes(a), nbytes(b)) < nbytes(pair) <= size(pair) + nbytes(a) + nbytes(b)


# -- own --------------------------------------------------------------------------------------


def test_own_copies_a_small_view_and_keeps_a_large_one() -> None:
    base = np.arange(1000, dtype=np.float32)
    small = base[10:20]
    out = own(small)
    assert out.base is None and out.flags.owndata
    assert not np.shares_memory(out, base)
    np.testing.assert_array_equal(out, small)
    assert nbytes(out) == size(out) < nbytes(small)
    large = base[:900]
    assert own(large) is large


def test_own_copies_arrays_backed_by_bytes_or_memmap(tmp_path: Path) -> None:
    raw = bytes(range(256)) * 4
    view = np.frombuffer(raw, dtype=np.uint8)
    out = own(view)
    assert out.flags.owndata and out.flags.writeable
    np.testing.assert_array_equal(out, view)

    path = tmp_path / "table.npy"
    np.save(path, np.arange(2000, dtype=np.int64).reshape(100, 20))
    mapped = np.load(path, mmap_mode="r")
    for a in (mapped, mapped[7], mapped[:]):
        out = own(a)
        assert type(out) is np.ndarray  # not a memmap: held in RAM
        assert out.flags.owndata
        np.testing.assert_array_equal(out, a)
    del mapped, a


def test_own_clones_a_small_torch_view_and_keeps_a_large_one() -> None:
    t = torch.arange(1000, dtype=torch.float32)
    small = t[100:110]
    out = own(small)
    assert out.untyped_storage().nbytes() == 40
    assert out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    assert torch.equal(out, small)
    large = t[:800]
    assert own(large) is large


def test_own_loads_pil_images() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (6, 4), (10, 20, 30)).save(buffer, format="PNG")
    buffer.seek(0)
    im = Image.open(buffer)
    out = own(im)
    buffer.close()  # the pixels must be in memory now, not in the file
    assert np.asarray(out).shape == (4, 6, 3)
    assert out.getpixel((0, 0)) == (10, 20, 30)


def test_own_rebuilds_only_containers_that_changed() -> None:
    big = np.zeros(100)
    untouched = {"a": big, "b": [b"x", "y"]}
    assert own(untouched) is untouched
    base = np.arange(1000)
    item = Pair(big, {"row": base[3:5], "label": "z"})
    out = own(item)
    assert type(out) is Pair and out.left is big
    assert out.right["row"].flags.owndata
    assert_same(out, item)


def test_own_and_fresh_terminate_on_cycles() -> None:
    # Regression: both recursed forever on an item that contains itself.
    item: list[Any] = [np.arange(1000)[:3]]
    item.append(item)
    owned = own(item)
    assert owned[0].flags.owndata
    copy = fresh(item)
    assert copy is not item and copy[1] is copy
    copy[0][0] = 99
    assert item[0][0] == 0
    d: dict[str, Any] = {"v": [1]}
    d["self"] = d
    e = fresh(d)
    assert e["self"] is e and e["v"] is not d["v"]


# -- fresh ------------------------------------------------------------------------------------

int_arrays = hnp.arrays(
    st.sampled_from([np.int8, np.int32, np.float64]),
    hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4),
    elements=st.integers(-50, 50),
)
fresh_leaves = st.one_of(
    int_arrays,
    int_arrays.map(torch.from_numpy),
    int_arrays.map(lambda a: torch.nn.Parameter(torch.from_numpy(a), requires_grad=False)),
    st.builds(Record, st.text(max_size=3), int_arrays),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.integers(),
)


def _defaultdict(d: dict[str, Any]) -> collections.defaultdict[str, Any]:
    out: collections.defaultdict[str, Any] = collections.defaultdict(list)
    out.update(d)
    return out


def _containers(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    dicts = st.dictionaries(st.text(max_size=3), kids, max_size=3)
    return st.one_of(
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.builds(Pair, kids, kids),
        dicts,
        dicts.map(collections.OrderedDict),
        dicts.map(_defaultdict),
    )


fresh_trees = st.recursive(fresh_leaves, _containers, max_leaves=12)


def _mutate(obj: Any) -> None:
    """Changes, in place, every array, tensor, list and dict in `obj`."""
    if isinstance(obj, np.ndarray):
        obj += 1
    elif isinstance(obj, torch.Tensor):
        obj.add_(1)
    elif isinstance(obj, Record):
        _mutate(obj.values)
        obj.name += "!"
    elif isinstance(obj, dict):
        for v in obj.values():
            _mutate(v)
        obj["__mutated__"] = 1
    elif isinstance(obj, list):
        for v in obj:
            _mutate(v)
        obj.append("__mutated__")
    elif isinstance(obj, tuple):
        for v in obj:
            _mutate(v)


@given(fresh_trees)
def test_fresh_is_an_equal_copy_that_shares_nothing_mutable(item: Any) -> None:
    snapshot = deepcopy(item)
    copy = fresh(item)
    assert_same(copy, item)
    _mutate(copy)
    assert_same(item, snapshot)


def test_fresh_copies_the_objects_of_an_object_array() -> None:
    # Regression: the copy's elements were the cached objects themselves.
    a = np.empty(3, dtype=object)
    a[:] = [[1, 2], {"k": np.zeros(2)}, "s"]
    out = fresh(a)
    assert_same(list(out), list(a))
    out[0].append(3)
    out[1]["k"] += 1
    assert a[0] == [1, 2] and not a[1]["k"].any()


def test_fresh_returns_immutables_as_they_are_and_copies_jax_arrays() -> None:
    j = jnp.ones(3)
    item = ("s", b"b", 5, np.float32(2), j)
    out = fresh(item)
    assert out is not item and all(a is b for a, b in zip(out[:4], item[:4], strict=True))
    # Regression: the cached array itself came back, and a jitted step may delete it.
    assert out[4] is not j and out[4].sharding == j.sharding
    assert out[4].unsafe_buffer_pointer() != j.unsafe_buffer_pointer()
    np.testing.assert_array_equal(np.asarray(out[4]), np.asarray(j))
    out[4].delete()
    assert not j.is_deleted()


# -- own: borrowed memory ---------------------------------------------------------------------


def test_torch_storage_resizable_tells_borrowed_memory() -> None:
    # What `own` relies on (torch 2.13): torch's own allocations are resizable, borrowed
    # memory (NumPy, DLPack, a Python buffer) is not.
    assert torch.zeros(4).untyped_storage().resizable()
    assert torch.zeros(8)[2:4].untyped_storage().resizable()
    assert torch.nn.Parameter(torch.zeros(3)).untyped_storage().resizable()
    assert not torch.from_numpy(np.zeros(4)).untyped_storage().resizable()
    assert not torch.from_dlpack(np.zeros(4)).untyped_storage().resizable()
    assert not torch.frombuffer(bytearray(16), dtype=torch.uint8).untyped_storage().resizable()


@pytest.mark.parametrize(
    "borrow",
    [torch.from_numpy, torch.from_dlpack, lambda row: torch.nn.Parameter(torch.from_numpy(row))],
    ids=["from_numpy", "from_dlpack", "parameter"],
)
def test_own_clones_a_tensor_whose_storage_borrows_a_numpy_array(borrow: Any) -> None:
    # Regression: a tensor over one 8 KB row of an 8 MB array has an 8 KB storage, so it
    # looked compact and was kept, pinning the whole array the cache never counted.
    frame = np.arange(1024 * 1024, dtype=np.float64).reshape(1024, 1024)
    t = borrow(frame[0])
    expected = frame[0].copy()
    out = own(t)
    assert type(out) is type(t) and out.requires_grad == t.requires_grad
    assert out.untyped_storage().resizable() and out.untyped_storage().nbytes() == 8192
    np.testing.assert_array_equal(out.detach().numpy(), expected)
    assert nbytes(out) == size(out) + 8192
    alive = weakref.ref(frame)
    del frame, t
    gc.collect()
    assert alive() is None  # the cache's copy does not keep the 8 MB array alive


def test_an_array_viewing_a_tensor_counts_its_storage_and_is_owned() -> None:
    # Regression: `tensor.numpy()` has the tensor as base; only the view's bytes counted.
    t = torch.zeros(1000, dtype=torch.float32)
    v = t.numpy()[:10]
    assert isinstance(v.base, torch.Tensor) or isinstance(_root(v), torch.Tensor)
    assert nbytes(v) == size(v) + 4000
    pair = [t, v]
    assert nbytes(pair) == size(pair) + size(t) + size(v) + 4000
    out = own(t.numpy())  # the tensor's memory is not NumPy's: a copy of its own
    assert out.flags.owndata and not np.shares_memory(out, t.numpy())


def _root(a: np.ndarray) -> Any:
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def test_records_of_a_structured_array_count_pin_and_copy() -> None:
    table = np.zeros(1000, dtype=[("x", "i4"), ("y", "f8")])
    rec = table[3]
    assert nbytes(rec) == size(rec) + table.nbytes  # it pins the whole table
    owned = own(rec)
    base: Any = owned.base  # NumPy's stubs say a scalar's base is None
    assert type(owned) is np.void and _root(base) is not table
    # Regression: a record is a view; fresh returned it, so changing it changed the cache.
    out = fresh(rec)
    out["x"] = 7
    assert table[3]["x"] == 0 and rec["x"] == 0
    assert type(out) is np.void and out["y"] == 0.0


# -- fresh: types kept, unknown objects copied ------------------------------------------------


def test_fresh_keeps_a_parameter_a_parameter() -> None:
    p = torch.nn.Parameter(torch.arange(6.0))
    out = fresh(p)
    assert type(out) is torch.nn.Parameter and out.requires_grad
    assert torch.equal(out, p)
    assert out.untyped_storage().data_ptr() != p.untyped_storage().data_ptr()
    with torch.no_grad():
        out.add_(1)
    assert p[0].item() == 0.0


class Tagged(torch.Tensor):
    """A tensor subclass torch's operations keep."""


def test_fresh_keeps_a_tensor_subclass() -> None:
    t = torch.arange(4.0).as_subclass(Tagged)
    out = fresh(t)
    assert type(out) is Tagged and torch.equal(out, t)
    out.add_(1)
    assert t[0].item() == 0.0


@pytest.mark.parametrize(("fmt", "cls"), [("PNG", "PngImageFile"), ("JPEG", "JpegImageFile")])
def test_fresh_keeps_an_opened_image_its_type_and_format(fmt: str, cls: str) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 100, 50)).save(buffer, format=fmt)
    buffer.seek(0)
    im = own(Image.open(buffer))
    assert type(im).__name__ == cls
    out = fresh(im)
    # Regression: Image.copy made a plain PIL.Image.Image, its `format` None.
    assert type(out) is type(im) and out.format == fmt
    np.testing.assert_array_equal(np.asarray(out), np.asarray(im))
    out.putpixel((0, 0), (1, 2, 3))
    assert im.getpixel((0, 0)) != (1, 2, 3)
    plain = Image.new("L", (3, 2), 9)
    assert type(fresh(plain)) is Image.Image


def test_fresh_deep_copies_other_objects() -> None:
    # Regression: a dataclass came back as it was: changing its array changed the cache.
    shared = np.zeros(3)
    rec = Record("r", shared)
    item = {"rec": rec, "same": shared}
    out = fresh(item)
    assert type(out["rec"]) is Record and out["rec"] is not rec
    out["rec"].values += 1
    out["rec"].name = "changed"
    assert not shared.any() and rec.name == "r"
    assert out["rec"].values is out["same"]  # one copy of an object the item holds twice


class Locked:
    def __init__(self) -> None:
        self.lock = threading.Lock()  # cannot be deep-copied


def test_fresh_returns_an_object_that_refuses_deepcopy_as_it_is() -> None:
    obj = Locked()
    out = fresh([obj, np.ones(2)])
    assert out[0] is obj


# -- JAX: donation and replicated bytes -------------------------------------------------------


def test_a_donating_jitted_step_does_not_delete_what_the_preloader_holds() -> None:
    # Regression: a hit returned the cached array itself; the step donated (deleted) it and
    # the next epoch got "Array has been deleted".
    n = 4
    source = [jnp.arange(8.0) + i for i in range(n)]
    step = jax.jit(lambda x: x * 2, donate_argnums=0)
    pre = Preloader(source, order=range(n), threads=1)
    try:
        for _epoch in range(2):
            for i in range(n):
                x = pre[i]
                out = step(x)
                assert x.is_deleted()  # the step did donate it
                np.testing.assert_array_equal(np.asarray(out), 2 * (np.arange(8.0) + i))
    finally:
        pre.close()
    assert not any(a.is_deleted() for a in source)


@pytest.mark.multidevice
def test_a_replicated_jax_array_counts_every_copy_held_here() -> None:
    devices = jax.devices()
    assert len(devices) == 4
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    a = jnp.arange(64, dtype=jnp.float32)
    replicated = jax.device_put(a, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    split = jax.device_put(a, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    # Regression: a replicated array counted one copy of its 256 bytes, not four.
    assert nbytes(replicated) == size(replicated) + 4 * 256
    assert nbytes(split) == size(split) + 256
    copied = fresh(replicated)
    assert copied.sharding == replicated.sharding
    np.testing.assert_array_equal(np.asarray(copied), np.asarray(a))


# -- map_leaves -------------------------------------------------------------------------------


def test_map_leaves_terminates_on_cycles_and_maps_each_leaf_once() -> None:
    # Regression: it recursed forever on an item that contains itself.
    calls: list[Any] = []

    def double(x: Any) -> Any:
        calls.append(x)
        return x * 2

    leaf = np.arange(3)
    item: list[Any] = [leaf, {"again": leaf}]
    item.append(item)
    out = map_leaves(item, double)
    assert len(calls) == 1
    np.testing.assert_array_equal(out[0], 2 * leaf)
    assert out[1]["again"] is out[0] and out[2] is item
    d: dict[str, Any] = {"n": 1}
    d["self"] = d
    assert map_leaves(d, lambda x: x) is d
