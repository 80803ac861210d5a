"""Engine: the CPU cleanly without a GPU, GPU selection on recorded NVML readings, and the
devices it hands to torch and JAX (realize, gear, coat, Tank)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dualtrain import Craft, dock
from dualtrain.cockpit import CPU, GPU, Engine, GPUtil
from dualtrain.errors import ArgumentError
from tests.cockpit.fake_nvml import FakeNVML
from tests.cockpit.test_gputil import cards


def fake_util(*free: float) -> GPUtil:
    return GPUtil(nvml=FakeNVML(cards(*free)))


class Tiny(Craft):
    def __init__(self):
        super().__init__("tiny")
        self.fc = dock.Dense(3, 2)

    def run(self, x):
        return self.fc(x)


# -- picking -------------------------------------------------------------------------------


def test_the_cpu_engine_picks_nothing():
    engine = Engine()
    assert engine.device == CPU and engine.gpus == [] and engine.gpu is None
    assert engine.cuda_ordinal is None and repr(engine) == "Engine(device='CPU')"


def test_a_gpu_engine_without_a_gpu_warns_and_runs_on_the_cpu():
    with pytest.warns(RuntimeWarning, match=r"Engine: no GPU.*; running on the CPU"):
        engine = Engine("GPU", ngpus=2, least_mem=100)
    assert engine.device == CPU and engine.gpu is None


def test_gpus_are_picked_by_room_and_each_local_rank_takes_its_own():
    util = fake_util(1000, 30000, 20000, 40000)
    ranks = [Engine(GPU, ngpus=2, least_mem=2048, gputil=util, local_rank=r) for r in (0, 1)]
    assert [g.index for g in ranks[0].gpus] == [1, 3]  # the two roomiest, in NVML order
    assert [e.gpu.index for e in ranks] == [1, 3]
    assert [e.cuda_ordinal for e in ranks] == [1, 3]
    assert ranks[0].cuda_ordinals == (1, 3)
    with pytest.raises(ArgumentError, match=r"local rank 2 .* ngpus=mv.nworld"):
        Engine(GPU, ngpus=2, gputil=util, local_rank=2)


def test_the_local_rank_comes_from_the_launcher(monkeypatch):
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}.items():  # torchrun
        monkeypatch.setenv(name, value)
    assert Engine(GPU, ngpus=2, gputil=fake_util(5000, 5000)).gpu.index == 1
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    slurm = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2",
             "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"}  # fmt: skip
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    assert Engine(GPU, ngpus=2, gputil=fake_util(5000, 5000)).local_rank == 1
    monkeypatch.setenv("SLURM_LOCALID", "x")
    with pytest.raises(ArgumentError, match="SLURM_LOCALID"):
        Engine(GPU, ngpus=2, gputil=fake_util(5000, 5000))


def test_too_little_room_falls_back_with_the_reason():
    with pytest.warns(RuntimeWarning, match="no GPU has 4096 MiB free"):
        engine = Engine("gpu", least_mem=4096, gputil=fake_util(1000, 2000))
    assert engine.device == CPU


def test_named_gpus_are_taken_as_named():
    engine = Engine(GPU, available_gpus=(2, 0), gputil=fake_util(10, 10, 10))
    assert [g.index for g in engine.gpus] == [0, 2] and engine.gpu.index == 0
    with pytest.raises(ArgumentError, match=r"available_gpus.*among \[0, 1, 2\]"):
        Engine(GPU, available_gpus=(5,), gputil=fake_util(10, 10, 10))


def test_numpy_counts_are_counts():
    assert len(Engine(GPU, ngpus=np.int64(2), least_mem=0, gputil=fake_util(9, 9)).gpus) == 2


def test_a_craft_is_geared_to_an_engine_not_a_mode():
    with pytest.raises(ArgumentError, match="realized module"):
        Tiny().gear(True)


def test_nebulae_spelling_ngpu():
    assert len(Engine(GPU, ngpu=2, least_mem=0, gputil=fake_util(9, 9, 9)).gpus) == 2
    with pytest.raises(ArgumentError, match="same setting"):
        Engine(GPU, ngpus=2, ngpu=2)


def test_an_unknown_cuda_number_is_explained(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    engine = Engine(GPU, gputil=fake_util(9000, 1000))  # picks index 0, hidden from CUDA
    with pytest.raises(ArgumentError, match="CUDA_VISIBLE_DEVICES"):
        engine.cuda_ordinal  # noqa: B018


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"device": "TPU"}, "device"),
        ({"device": None}, "device"),
        ({"ngpus": 0}, "ngpus"),
        ({"ngpus": True}, "ngpus"),
        ({"available_gpus": (0, 0)}, "available_gpus"),
        ({"available_gpus": (-1,)}, "available_gpus"),
        ({"available_gpus": "0"}, "available_gpus"),
        ({"local_rank": -1}, "local_rank"),
        ({"least_mem": "x"}, "least_mem"),
        ({"device": "CPU", "least_mem": -1}, "least_mem"),
    ],
)
def test_bad_engine_arguments_are_named(kwargs, name):
    with pytest.raises(ArgumentError, match=name):
        Engine(**{"device": GPU, **kwargs})


# -- the frameworks' devices ---------------------------------------------------------------


def test_torch_gets_the_engine_device():
    torch = pytest.importorskip("torch")
    import dualtrain_torch as dt

    engine = Engine()
    assert engine.torch_device == torch.device("cpu")
    module = dt.realize(Tiny(), seed=0, device=engine)
    assert module.fc.weight.device.type == "cpu"
    assert dt.realize(Tiny().gear(engine), seed=0).fc.weight.device.type == "cpu"
    assert module.gear(engine) is module and module.gear(False) is module
    assert not module.training and module.gear(True).training
    assert dt.coat(np.ones(2), device=engine).device.type == "cpu"
    # A GPU Engine whose GPU torch does not have here is refused by torch's own check.
    gpu = Engine(GPU, gputil=fake_util(9000))
    with pytest.raises(ArgumentError, match="ordinals"):
        gpu.torch_device  # noqa: B018


def test_jax_gets_the_engine_device():
    jax = pytest.importorskip("jax")
    import dualtrain_jax as dj

    engine = Engine()
    assert engine.jax_devices == [jax.devices("cpu")[0]] == [engine.jax_device]
    module = dj.realize(Tiny(), seed=0, device=engine)
    assert module.params["fc.weight"].devices() == {jax.devices("cpu")[0]}
    assert module.gear(engine) is module and module.gear(False).train is False
    assert dj.coat([1.0, 2.0], device=engine).devices() == {jax.devices("cpu")[0]}
    with pytest.raises(ArgumentError, match="ordinals"):
        Engine(GPU, gputil=fake_util(9000)).jax_devices  # noqa: B018


def test_a_tank_delivers_to_the_engine_device(tmp_path):
    torch = pytest.importorskip("torch")
    from dualtrain.fuel import FuelGenerator, Tank
    from tests.fuel.raw import DTYPES, make_folder

    make_folder(str(tmp_path), 8, size=(8, 8))
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"), dtype=DTYPES)
    paths = gen.generate(str(tmp_path / "p.h5"), 8, 8, encode="PNG", workers=0).paths
    tank = Tank(paths, {"label": "int64"}, 4, to="torch", device=Engine())
    batch = next(iter(tank))
    assert isinstance(batch["label"], torch.Tensor) and batch["label"].device.type == "cpu"


@pytest.mark.gpu
def test_a_real_gpu_engine_places_both_frameworks():
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    import dualtrain_jax as dj
    import dualtrain_torch as dt

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = Engine(GPU, least_mem=0)
    assert engine.gpu is not None and engine.torch_device.type == "cuda"
    assert dt.realize(Tiny(), seed=0, device=engine).fc.weight.is_cuda
    assert engine.jax_device.platform == "gpu"
    assert dj.realize(Tiny(), seed=0, device=engine).params["fc.weight"].devices() == {
        engine.jax_device
    }
