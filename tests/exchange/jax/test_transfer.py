"""The JAX adapter's one host -> device road: `dualtrain_jax.transfer.Transfer`."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

import dualtrain
from dualtrain import backends, convert, count_copies
from dualtrain.errors import ArgumentError, DtypeError
from dualtrain.tree import leaves
from tests.strategies import DTYPES_32, arrays, pytrees, same_bits

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding  # noqa: E402

from dualtrain_jax import transfer  # noqa: E402
from dualtrain_jax.data import Courier  # noqa: E402
from dualtrain_jax.transfer import Transfer, parse_device  # noqa: E402


def targets():
    """Every kind of target a Transfer takes, and what jax.device_put is given for it."""
    cpu = jax.devices("cpu")
    last = cpu[-1]
    return [
        (None, None),
        ("cpu", cpu[0]),
        (f"cpu:{len(cpu) - 1}", last),
        (last, last),
        (SingleDeviceSharding(last), SingleDeviceSharding(last)),
    ]


def assert_same_array(got, want) -> None:
    assert isinstance(got, jax.Array)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.sharding == want.sharding
    assert same_bits(np.asarray(got), np.asarray(want))


@given(
    tree=pytrees(leaves=st.one_of(arrays(dtypes=DTYPES_32), st.integers(), st.none())),
    target=st.sampled_from(range(5)),
)
def test_transfer_equals_jax_device_put_for_any_pytree(tree, target):
    device, put_to = targets()[target]
    out = Transfer(device)(tree)
    got, want = leaves(out), leaves(tree)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, np.ndarray):
            assert_same_array(g, jax.device_put(w, put_to))
        else:
            assert g is w  # numbers, None: unchanged


@given(a=arrays(dtypes=DTYPES_32))
def test_no_device_imports_without_a_copy(a):
    with count_copies() as c:
        Transfer()(a)
    assert c.copies == (1 if a.dtype.name == "bfloat16" else 0)  # as convert counts it


@pytest.mark.multidevice
def test_a_sharding_splits_the_batch_over_the_four_host_devices():
    devices = jax.devices()
    assert len(devices) == 4
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
    batch = {"x": np.arange(32, dtype=np.float32).reshape(8, 4), "n": np.arange(8)}
    out = Transfer(sharding)(batch)
    for key in batch:
        assert out[key].sharding == sharding and len(out[key].addressable_shards) == 4
        np.testing.assert_array_equal(np.asarray(out[key]), batch[key])


def test_a_one_device_mesh_is_a_sharding_too():
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    out = Transfer(sharding)(np.arange(6, dtype=np.int32))
    assert out.sharding == sharding
    np.testing.assert_array_equal(np.asarray(out), np.arange(6))


# ---- the one road ------------------------------------------------------------------------


def test_courier_takes_cpu_as_convert_does():
    """The JAX Courier refused "cpu", which convert takes; both read it the same now."""
    courier = Courier("cpu")
    out = courier({"x": np.ones(3, np.float32), "name": "a"})
    assert out["x"].devices() == {jax.devices("cpu")[0]} and out["name"] == "a"
    assert convert(np.ones(3, np.float32), to="jax", device="cpu").devices() == out["x"].devices()


def test_tank_courier_is_the_transfer():
    # The Transfer, but for host batches of the Tank's own arrays (dualtrain_jax.data).
    assert issubclass(Courier, Transfer)
    assert backends.load_part("jax", "data").Courier is Courier
    courier = Courier("cpu")
    out = courier({"image": np.zeros((2, 2), np.uint8), "label": np.arange(2, dtype=np.int32)})
    assert out["label"].devices() == {jax.devices("cpu")[0]} and courier.sent == 2


@given(a=arrays(dtypes=DTYPES_32), b=arrays(dtypes=DTYPES_32))
def test_a_host_courier_gives_what_convert_gives_and_counts_its_copies(a, b):
    # A Tank's batch (a dict of its own arrays): leaves up to 256 KiB copied by JAX.
    with count_copies() as c:
        out = Courier()({"a": a, "b": b})
    assert list(out) == ["a", "b"]
    for key, x in (("a", a), ("b", b)):
        assert_same_array(out[key], convert(x, to="jax"))
    copied = [0 < x.nbytes <= 256 * 1024 and x.dtype.name != "bfloat16" for x in (a, b)]
    assert c.copies == sum(1 if cp else copies_of(x) for cp, x in zip(copied, (a, b), strict=True))
    # Any other tree takes convert's road: shared, as convert counts it.
    with count_copies() as c:
        out = Courier()([a])
    assert_same_array(out[0], convert(a, to="jax"))
    assert c.copies == copies_of([a])


@given(
    a=arrays(dtypes=["int64", "uint64"]),
    small=st.booleans(),
)
def test_a_host_courier_narrows_wide_ints_as_convert_does(a, small):
    """Without x64, a Tank's int64 labels: a small leaf whose values fit 32 bits is narrowed
    and copied by JAX (two counted copies), equal to convert's; one whose values do not fit
    is refused with convert's error, naming it."""
    if small:
        a %= 1000  # in place: an array still (a 0-d one's `%` is a scalar)
    try:
        want = convert({"y": a}, to="jax")["y"]
    except DtypeError as error:
        with pytest.raises(DtypeError) as got:
            Courier()({"y": a})
        assert str(got.value) == str(error)
        return
    with count_copies() as c:
        out = Courier()({"y": a})["y"]
    assert_same_array(out, want)
    assert out.dtype == want.dtype == (np.int32 if a.dtype == np.int64 else np.uint32)
    fits = a.size and 0 < a.nbytes <= 256 * 1024
    assert c.copies == (2 if fits else copies_of([a]))


@pytest.mark.multidevice
def test_a_host_courier_places_batches_where_convert_does():
    cpu = jax.devices("cpu")
    small, big = np.arange(8, dtype=np.int32), np.ones(70_000, np.float32)  # 32 B, 273 KiB
    batch = {"small": dualtrain.aligned_copy(small), "big": dualtrain.aligned_copy(big)}
    out = Courier()(batch)
    assert {k: out[k].devices() for k in out} == {"small": {cpu[0]}, "big": {cpu[0]}}
    with jax.default_device(cpu[-1]):  # a default device set: convert's road for every leaf
        out = Courier()(batch)
        want = convert(batch, to="jax")
    for key in batch:
        assert out[key].devices() == want[key].devices() == {cpu[0]}
        assert out[key].committed == want[key].committed


def copies_of(tree) -> int:
    with count_copies() as c:
        convert(tree, to="jax")
    return c.copies


def test_convert_places_through_the_shared_transfer():
    target = jax.devices()[-1]
    road = transfer.shared(target)
    assert road is transfer.shared(f"cpu:{len(jax.devices('cpu')) - 1}")
    before = road.sent
    out = convert({"a": np.ones(3, np.float32), "b": np.ones(2, np.int32)}, to="jax", device=target)
    assert out["a"].devices() == {target} and road.sent == before + 2


def test_the_store_fetches_rows_through_its_transfer():
    from dualtrain_jax import attach

    store = dualtrain.EmbeddingStore(10, 3, std=0.5, seed=1, pinned=False)
    target = jax.devices()[-1]
    rows = attach(store, optax.sgd(0.1), device=f"cpu:{len(jax.devices('cpu')) - 1}")
    assert isinstance(rows.transfer, Transfer) and rows.device == target
    e = rows.fetch(np.array([1, 2, 2]))
    assert rows.transfer.sent == 2  # the rows, the inverse
    assert e.devices() == {target}
    rows.step(np.ones((3, 3), np.float32))


# ---- devices -----------------------------------------------------------------------------


# ids spelled out: an id "gpu" would read as the gpu marker (tests/conftest.py) and skip
@pytest.mark.parametrize(
    "device", ["gpu", "tpu", "cuda:x", "cuda:-1", "cpu:x", "cpu:99", True, 2.5],
    ids=lambda d: f"={d!r}",
)  # fmt: skip
def test_bad_devices_name_the_argument(device):
    with pytest.raises(ArgumentError, match=re.escape(f"got device={device!r}")) as info:
        Transfer(device)
    assert str(info.value).startswith("device must be a device JAX has here ('cpu'")


def test_gpu_without_gpu_says_so():
    if any(d.platform != "cpu" for d in jax.devices()):
        pytest.skip("a GPU is there")
    for device in ("gpu", "cuda", "cuda:0"):
        with pytest.raises(ArgumentError, match="CUDA is not available to JAX"):
            Transfer(device)


def test_parse_device_is_the_backends():
    assert parse_device("cpu") == jax.devices("cpu")[0]
    assert dualtrain.load("jax").parse_device("cpu") == jax.devices("cpu")[0]
