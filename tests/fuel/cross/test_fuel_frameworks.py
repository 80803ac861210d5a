"""Tank batches under torch and JAX: the same values as NumPy's, shared where possible."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain import ArgumentError
from dualtrain.fuel import FuelGenerator, Tank
from tests.fuel.raw import DTYPES, SPEC, make_folder
from tests.fuel.test_tank import assert_same, augment

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("raw")
    make_folder(str(folder), 13)
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    return gen.generate(str(folder / "p.npz"), 12, 16, encode="PNG", workers=0).paths


def as_numpy(batch: dict) -> dict:
    def one(x):
        if isinstance(x, list):
            return [one(v) for v in x]
        return x if isinstance(x, str) else np.asarray(x)

    return {k: one(v) for k, v in batch.items()}


@pytest.mark.parametrize("to", ["torch", "jax"])
def test_same_seed_same_batches_under_every_framework(pack, to):
    want = [Tank(pack, SPEC, 4, prep_fn=augment, seed=5).next() for _ in range(1)]
    tank = Tank(pack, SPEC, 4, prep_fn=augment, seed=5, to=to, workers=2)
    batches = [tank.next() for _ in range(5)]
    reference = Tank(pack, SPEC, 4, prep_fn=augment, seed=5)
    assert_same([as_numpy(b) for b in batches], [reference.next() for _ in range(5)])
    assert_same([as_numpy(batches[0])], want)
    image = batches[0]["image"]
    assert isinstance(image, torch.Tensor if to == "torch" else jax.Array)
    assert image.dtype == (torch.uint8 if to == "torch" else np.uint8)
    assert isinstance(batches[0]["name"][0], str)
    tank.close()


@pytest.mark.parametrize("to", ["torch", "jax"])
def test_batches_reach_the_framework_by_the_cheaper_road(pack, to):
    from dualtrain import count_copies

    # torch shares every batch array. JAX copies leaves up to 256 KiB (its copy is faster
    # than its DLPack import there; the arrays are the Tank's own) and each copy is counted.
    # int32 labels: JAX without x64 would narrow int64 ones, which is a copy.
    tank = Tank(pack, {"image": "uint8", "label": "int32"}, 4, to=to, cast="same_kind")
    with count_copies() as copies:
        batch = tank.next()
    if to == "torch":
        assert copies.copies == 0 and copies.nbytes == 0
    else:
        assert copies.copies == 2
        assert copies.nbytes == batch["image"].nbytes + batch["label"].nbytes


@pytest.mark.parametrize("to", ["torch", "jax"])
def test_batches_over_256_kib_share_the_host_buffer(tmp_path, to):
    from dualtrain import count_copies
    from tests.fuel.raw import write_table

    x = np.arange(1100 * 80, dtype=np.float32).reshape(1100, 80)
    path = write_table(str(tmp_path / "t.h5"), {"x": x, "y": np.arange(1100, dtype=np.int32)})
    tank = Tank(path, {"x": "float32", "y": "int32"}, 1024, shuffle=False, to=to)
    with count_copies() as copies:
        batch = tank.next()
    # x: 1024 x 80 float32 = 320 KiB, shared; y: 4 KiB, copied under JAX.
    assert copies.copies == (0 if to == "torch" else 1)
    np.testing.assert_array_equal(np.asarray(batch["x"]), x[:1024])
    np.testing.assert_array_equal(np.asarray(batch["y"]), np.arange(1024))


@pytest.mark.multidevice
def test_jax_batches_can_be_sharded_over_devices(pack):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices()
    assert len(devices) == 4
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
    tank = Tank(pack, {"image": "uint8", "label": "int64"}, 8, to="jax", device=sharding, seed=1)
    batch = tank.next()
    assert batch["image"].sharding == sharding
    assert len(batch["image"].addressable_shards) == 4
    plain = Tank(pack, {"image": "uint8", "label": "int64"}, 8, seed=1).next()
    np.testing.assert_array_equal(np.asarray(batch["image"]), plain["image"])


def test_bad_devices_are_named(pack):
    with pytest.raises(ArgumentError, match="device"):
        Tank(pack, SPEC, 4, to="jax", device="gpu:0")


@pytest.mark.gpu
def test_torch_batches_reach_cuda_through_pinned_buffers(pack):
    tank = Tank(pack, {"image": "uint8", "label": "int64"}, 4, to="torch", device="cuda", seed=1)
    plain = Tank(pack, {"image": "uint8", "label": "int64"}, 4, seed=1)
    for _ in range(5):  # more than the ring of pinned buffers
        batch, want = tank.next(), plain.next()
        assert batch["image"].is_cuda
        np.testing.assert_array_equal(batch["image"].cpu().numpy(), want["image"])
