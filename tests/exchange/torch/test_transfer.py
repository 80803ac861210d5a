"""The torch adapter's one host -> device road: `dualtrain_torch.transfer.Transfer`."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

import dualtrain
from dualtrain import backends, convert, count_copies
from dualtrain.errors import ArgumentError
from dualtrain.tree import leaves
from tests.helpers import address
from tests.strategies import DTYPES, arrays, pytrees, same_bits

torch = pytest.importorskip("torch")

from dualtrain_torch import transfer  # noqa: E402
from dualtrain_torch.compat.speedtorch import DataGadget, ModelFactory  # noqa: E402
from dualtrain_torch.data import Courier  # noqa: E402
from dualtrain_torch.transfer import Transfer, parse_device  # noqa: E402

HOST_DEVICES = [None, "cpu", torch.device("cpu")]


def as_tensor(a: np.ndarray, device) -> torch.Tensor:
    """What torch makes of `a` (bfloat16, which torch cannot read from NumPy, by its bits)."""
    if a.dtype.name == "bfloat16":
        return torch.as_tensor(a.view(np.int16), device=device).view(torch.bfloat16)
    return torch.as_tensor(a, device=device)


def assert_same_tensor(got, a: np.ndarray, device) -> None:
    want = as_tensor(a, device)
    assert isinstance(got, torch.Tensor)
    assert got.dtype == want.dtype and got.device == want.device and got.shape == want.shape
    assert same_bits(convert(got.cpu(), to="numpy"), a)


@given(
    tree=pytrees(leaves=st.one_of(arrays(dtypes=DTYPES), st.integers(), st.none())),
    device=st.sampled_from(HOST_DEVICES),
)
def test_transfer_equals_torch_as_tensor_for_any_pytree(tree, device):
    out = Transfer(device)(tree)
    got, want = leaves(out), leaves(tree)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, np.ndarray):
            assert_same_tensor(g, w, device)
        else:
            assert g is w  # numbers, None: unchanged


@given(a=arrays(dtypes=DTYPES))
def test_host_transfer_shares_memory_and_copies_nothing(a):
    with count_copies() as c:
        t = Transfer("cpu")(a)
    assert c.copies == 0
    if a.size:
        assert address(t) == address(a)


def test_read_only_arrays_are_copied_and_counted_as_convert_does():
    a = dualtrain.aligned_empty((4,), np.float32)
    a[:] = 1
    a.flags.writeable = False
    with count_copies() as c:
        t = Transfer("cpu")(a)
    assert c.copies == 1 and address(t) != address(a)


def test_other_devices_go_through_put():
    t = Transfer("meta")
    out = t({"x": np.ones((2, 3), np.float32), "n": 3})
    assert out["x"].device.type == "meta" and out["x"].shape == (2, 3) and out["n"] == 3
    assert t.sent == 1


# ---- the one road ------------------------------------------------------------------------


def _variant(a: np.ndarray, how: str) -> np.ndarray:
    if how == "read-only":
        a = a.copy()
        a.flags.writeable = False
    elif how == "byte-swapped":
        a = a.view(a.dtype.newbyteorder())
    elif how == "reversed":
        a = a[::-1] if a.ndim else a
    elif how == "every other row":
        a = a[::2] if a.ndim else a
    elif how == "a column":
        a = a.reshape(-1, 1)
    return a


VARIANTS = st.sampled_from(
    ["as is", "read-only", "byte-swapped", "reversed", "every other row", "a column"]
)


@given(a=arrays(dtypes=DTYPES), b=arrays(dtypes=DTYPES), how=VARIANTS)
def test_a_host_batch_is_what_convert_gives_without_its_checks(a, b, how):
    """Dicts of plain arrays (a Tank's batch) skip convert's per-leaf checks; same tensors."""
    batch = {"a": a, "b": _variant(b, how)}
    with count_copies() as fast:
        out = Transfer()(batch)
    with count_copies() as slow:
        want = convert(batch, to="torch")
    assert (fast.copies, fast.nbytes) == (slow.copies, slow.nbytes)
    for key, x in batch.items():
        got = out[key]
        assert got.dtype == want[key].dtype and got.shape == want[key].shape
        assert got.stride() == want[key].stride()
        assert same_bits(convert(got, to="numpy"), convert(want[key], to="numpy"))
        if slow.copies == 0 and x.size:  # shared by both: the same memory as the array
            assert got.data_ptr() == want[key].data_ptr() == x.ctypes.data


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "uint8"])
def test_a_host_batch_with_unused_odd_strides_gets_convert_s_strides(dtype):
    x = np.zeros((2, 3), dtype)[::2]  # shape (1, 3): the first stride is never used
    got, want = Transfer()({"x": x})["x"], convert({"x": x}, to="torch")["x"]
    assert got.stride() == want.stride()  # (3, 1) or (6, 1): what convert gives per dtype


def test_tank_courier_is_the_transfer():
    assert Courier is Transfer
    assert backends.load_part("torch", "data").Courier is Transfer
    courier = Courier("cpu")
    out = courier({"image": np.zeros((2, 2), np.uint8), "label": np.arange(2)})
    assert out["label"].device.type == "cpu" and courier.sent == 2


def test_convert_places_through_the_shared_transfer():
    road = transfer.shared("meta")
    assert road is transfer.shared(torch.device("meta"))
    before = road.sent
    out = convert(
        {"a": np.ones(3, np.float32), "b": np.ones(2, np.int64)}, to="torch", device="meta"
    )
    assert out["a"].device.type == "meta" and road.sent == before + 2
    # No move, no Transfer: an array already on the device is left where it is.
    convert(np.ones(3, np.float32), to="torch", device="cpu")
    assert road.sent == before + 2


def test_the_store_fetches_rows_through_its_transfer():
    from dualtrain_torch import attach

    store = dualtrain.EmbeddingStore(10, 3, std=0.5, seed=1, pinned=False)
    rows = attach(store, torch.optim.SGD, lr=0.1, device="cpu")
    assert isinstance(rows.transfer, Transfer) and rows.device == torch.device("cpu")
    e = rows.fetch(np.array([1, 2, 2]))
    assert rows.transfer.sent == 2  # the rows, the inverse
    e.sum().backward()
    rows.step()


def test_the_speedtorch_shim_swaps_rows_in_through_its_transfer(tmp_path):
    factory = ModelFactory(torch.nn.Embedding(4, 3), 20, 3, deviceType="cpu")
    assert isinstance(factory.transfer, Transfer)
    factory.variableTransformer(2, 2)
    factory.beforeForwardPass(np.array([[1, 2], [2, 5]]))
    assert factory.transfer.sent == 2  # the rows, the ids
    np.save(tmp_path / "d.npy", np.arange(12.0).reshape(4, 3))
    gadget = DataGadget(str(tmp_path / "d.npy"))
    gadget.gadgetInit()
    assert isinstance(gadget.transfer, Transfer)
    np.testing.assert_array_equal(gadget.getData([2]).cpu().numpy(), [[6.0, 7.0, 8.0]])


# ---- devices -----------------------------------------------------------------------------


# ids spelled out: an id "gpu" would read as the gpu marker (tests/conftest.py) and skip
@pytest.mark.parametrize(
    "device", ["gpu", "tpu", "cuda:x", "cuda:-1", "cpu:x", True, 2.5], ids=lambda d: f"={d!r}"
)
def test_bad_devices_name_the_argument(device):
    with pytest.raises(ArgumentError, match=re.escape(f"got device={device!r}")) as info:
        Transfer(device)
    assert str(info.value).startswith("device must be a device torch has here ('cpu'")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is there")
def test_cuda_without_cuda_says_so():
    for device in ("cuda", "cuda:0", torch.device("cuda:1")):
        with pytest.raises(ArgumentError, match="CUDA is not available to torch"):
            Transfer(device)


def test_parse_device_is_the_backends():
    assert parse_device("cpu") == torch.device("cpu")
    assert dualtrain.load("torch").parse_device("cpu") == torch.device("cpu")


# ---- CUDA ----------------------------------------------------------------------------------


@pytest.mark.gpu
@given(tree=pytrees(leaves=arrays(dtypes=DTYPES)))
def test_cuda_transfer_equals_torch_as_tensor(tree):
    out = Transfer("cuda")(tree)
    for g, w in zip(leaves(out), leaves(tree), strict=True):
        if isinstance(w, np.ndarray):
            assert_same_tensor(g, w, torch.device("cuda", torch.cuda.current_device()))
        else:
            assert g is w  # the dataclass's string field stays as it is


@pytest.mark.gpu
def test_cuda_staging_lets_the_caller_reuse_its_buffer_at_once():
    road = Transfer("cuda:0")
    host = np.zeros((256, 1024), np.float32)
    sent = []
    for k in range(8):  # more calls than the ring has buffers
        host[...] = k
        sent.append(road({"x": host}))
    torch.cuda.synchronize()
    assert [float(b["x"].mean()) for b in sent] == [float(k) for k in range(8)]
    assert road.sent == 8


@pytest.mark.gpu
def test_cuda_takes_read_only_bfloat16_and_strided_arrays():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    ro = a.copy()
    ro.flags.writeable = False
    bf = a.astype(ml_dtypes.bfloat16)
    out = Transfer("cuda")({"ro": ro, "bf": bf, "strided": a[:, ::2]})
    np.testing.assert_array_equal(out["ro"].cpu().numpy(), a)
    assert out["bf"].dtype == torch.bfloat16
    np.testing.assert_array_equal(out["strided"].cpu().numpy(), a[:, ::2])
