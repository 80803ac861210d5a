"""GPUtil on NVML: clean answers without a GPU, selection and CUDA ordinals on recorded NVML
readings, and a monitor whose summary is the readings' own mean and peak."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, strategies as st

from dualtrain.cockpit import GPUtil, Stat
from dualtrain.cockpit.nvml import GPUInfo, cuda_ordinals
from dualtrain.errors import ArgumentError
from tests.cockpit.fake_nvml import Card, FakeNVML, NVMLError
from tests.helpers import CHILD_TIMEOUT_S


def cards(*free: float, name: str = "NVIDIA A100-SXM4-40GB") -> list[Card]:
    return [
        Card(name=name, total_mib=40960, free_mib=f, bus_id=f"00000000:{0x10 + i:02X}:00.0",
             uuid=f"GPU-{i:08x}-aaaa")
        for i, f in enumerate(free)
    ]  # fmt: skip


# -- no GPU: this machine, as it is ------------------------------------------------------


def test_no_gpu_answers_empty_with_one_line_reason():
    util = GPUtil()
    assert util.gpus() == [] and util.available(2, 0) == []
    util.monitor(0.01)
    assert not util.monitoring
    assert util.status() == {}
    assert util.reason.startswith("no GPU") and "\n" not in util.reason
    assert "no GPU" in repr(util)


def test_without_nvidia_ml_py_the_reason_says_so():
    code = (
        "import sys; sys.modules['pynvml'] = None\n"
        "from dualtrain.cockpit import GPUtil\n"
        "u = GPUtil(); assert u.available() == [] and u.status() == {}; print(u.reason)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        timeout=CHILD_TIMEOUT_S,
    )  # fmt: skip
    assert out.stdout.strip() == "no GPU monitoring: nvidia-ml-py is not installed"


def test_a_driver_that_fails_to_start_is_no_gpu():
    util = GPUtil(nvml=FakeNVML(cards(1000), init_error=NVMLError("Driver Not Loaded")))
    assert util.gpus() == [] and util.status() == {}
    assert util.reason == "no GPU: NVML is not available (Driver Not Loaded)"


# -- selection -----------------------------------------------------------------------------


@given(
    free=st.lists(st.integers(0, 40960), min_size=1, max_size=8),
    ngpus=st.integers(1, 9),
    least_mem=st.integers(0, 40960),
)
def test_available_keeps_the_roomiest_that_qualify(free, ngpus, least_mem):
    got = GPUtil(nvml=FakeNVML(cards(*free))).available(ngpus, least_mem)
    qualifying = [i for i, f in enumerate(free) if f >= least_mem]
    assert len(got) == min(ngpus, len(qualifying))
    assert [g.index for g in got] == sorted(g.index for g in got)
    assert all(g.free_mib >= least_mem for g in got)
    left_out = set(qualifying) - {g.index for g in got}
    # nothing left out had more room than something taken
    assert all(free[i] <= min(g.free_mib for g in got) for i in left_out)


def test_available_reports_what_nvml_reports():
    (gpu,) = GPUtil(nvml=FakeNVML(cards(1234.5))).available(1, 1000)
    assert gpu == GPUInfo(0, 0, "NVIDIA A100-SXM4-40GB", 40960, 1234.5, "00000000:10:00.0",
                      "GPU-00000000-aaaa")  # fmt: skip


@pytest.mark.parametrize(
    ("ngpus", "least_mem"), [(0, 10), (True, 10), ("2", 10), (1.5, 10), (1, -1),
                             (1, float("nan")), (1, "2048")]
)  # fmt: skip
def test_bad_selection_arguments_are_named(ngpus, least_mem):
    with pytest.raises(ArgumentError, match=r"ngpus|least_mem"):
        GPUtil(nvml=FakeNVML(cards(1000))).available(ngpus, least_mem)


# -- CUDA ordinals -------------------------------------------------------------------------


def gpus_on_buses(*buses: int, names: tuple[str, ...] = ()) -> list[GPUInfo]:
    return [
        GPUInfo(i, None, names[i] if names else "same", 1, 1, f"0000:{b:02X}:00.0", f"GPU-{b:04x}")
        for i, b in enumerate(buses)
    ]


def test_ordinals_follow_pci_order_and_visible_devices():
    gpus = gpus_on_buses(0x3B, 0x1A, 0x86)  # NVML index order is not bus order here
    assert cuda_ordinals(gpus, {}) == {1: 0, 0: 1, 2: 2}
    assert cuda_ordinals(gpus, {"CUDA_VISIBLE_DEVICES": "2,0"}) == {2: 0, 1: 1}
    assert cuda_ordinals(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-0086"}) == {2: 0}
    # Like CUDA: an entry naming no device (or one already listed) ends the list.
    assert cuda_ordinals(gpus, {"CUDA_VISIBLE_DEVICES": "1,7,0"}) == {0: 0}
    assert cuda_ordinals(gpus, {"CUDA_VISIBLE_DEVICES": "1,1,0"}) == {0: 0}
    assert cuda_ordinals(gpus, {"CUDA_VISIBLE_DEVICES": ""}) == {}
    assert cuda_ordinals(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-00"}) == {}  # ambiguous prefix


def test_mixed_models_need_pci_bus_order_to_be_known():
    gpus = gpus_on_buses(0x1A, 0x3B, names=("NVIDIA A100", "NVIDIA T4"))
    assert cuda_ordinals(gpus, {}) == {}  # CUDA orders fastest first: only CUDA knows
    assert cuda_ordinals(gpus, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == {0: 0, 1: 1}


def test_gpus_carry_their_cuda_ordinal(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    got = GPUtil(nvml=FakeNVML(cards(100, 200))).gpus()
    assert [(g.index, g.cuda) for g in got] == [(0, None), (1, 0)]


# -- monitoring ----------------------------------------------------------------------------


def readings(fake: FakeNVML, index: int) -> int:
    """How many times the sampler has read GPU `index` (monitor's reading included)."""
    return len(fake.log[index].get("utilization", []))


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Polls `condition` until it holds: the sampler's thread runs when the machine lets it."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.001)


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dualtrain-gputil"]


def test_status_is_the_mean_and_peak_of_what_was_read():
    fake = FakeNVML(cards(1000, 2000))
    util = GPUtil(nvml=fake)
    util.monitor(0.002)
    assert util.monitoring
    # monitor's reading and one of the thread's: with status's own, three samples
    wait_until(lambda: min(readings(fake, 0), readings(fake, 1)) >= 2, "two readings")
    summary = util.status()
    assert not util.monitoring and util.reason == ""
    for index in (0, 1):
        entry = summary[index]
        assert entry["name"] == "NVIDIA A100-SXM4-40GB" and entry["samples"] >= 3
        for metric in ("utilization", "power_w", "temperature_c", "memory_used_mib"):
            values = fake.log[index][metric][-entry["samples"] :]
            assert entry[metric] == Stat(sum(values) / len(values), max(values)), metric
        assert entry["pcie_tx_mbps"] is None and entry["pcie_rx_mbps"] is None  # unsupported


def test_status_without_monitor_is_one_reading_now():
    summary = GPUtil(nvml=FakeNVML(cards(1000))).status()
    assert summary[0]["samples"] == 1 and summary[0]["utilization"] == Stat(10.0, 10.0)


def test_a_device_lost_mid_run_keeps_what_was_sampled():
    fake = FakeNVML(cards(1000))
    util = GPUtil(nvml=fake)
    util.monitor(0.002)
    # the utilization cycle's third value (90) read before the device goes
    wait_until(lambda: readings(fake, 0) >= 3, "three readings")
    fake.lost = True
    wait_until(lambda: not sampler_threads(), "the sampler to stop at the lost device")
    summary = util.status()
    assert summary[0]["samples"] >= 2 and summary[0]["utilization"].peak == 90.0
    assert util.reason == "monitoring stopped early: GPU is lost"
    util.monitor(0.002)  # nothing to monitor now: says so, does not raise
    assert not util.monitoring and util.reason == "no monitoring: GPU is lost"


def test_monitor_arguments_and_twice():
    util = GPUtil(nvml=FakeNVML(cards(1000)))
    for sec in (0, -1, float("inf"), "5", None):
        with pytest.raises(ArgumentError, match="sec"):
            util.monitor(sec)
    util.monitor(3600)
    with pytest.raises(ArgumentError, match="already running"):
        util.monitor(10)
    # status stops an hour-long sampler at once: it does not wait out the period (the
    # join below only guards the test against that hour; it returns as soon as status does)
    stopper = threading.Thread(target=util.status, daemon=True)
    stopper.start()
    stopper.join(120)
    assert not stopper.is_alive(), "status() waited for the sampler's period"
    assert not util.monitoring and not sampler_threads()


def test_nvml_is_shut_down_once_per_init():
    fake = FakeNVML(cards(1000))
    first, second = GPUtil(nvml=fake), GPUtil(nvml=fake)
    assert fake.inits == 2
    del first
    assert fake.shutdowns == 1
    del second
    assert fake.shutdowns == 2


def test_a_gputil_dropped_while_monitoring_stops_its_thread_and_closes_nvml():
    import gc

    fake = FakeNVML(cards(1000))
    util = GPUtil(nvml=fake)
    util.monitor(0.005)
    del util
    gc.collect()
    assert "dualtrain-gputil" not in [t.name for t in threading.enumerate()]
    assert fake.shutdowns == fake.inits == 1


def test_nvml_that_cannot_list_releases_its_init():
    class Broken(FakeNVML):
        def nvmlDeviceGetCount(self):  # noqa: N802
            raise NVMLError("Unknown Error")

    fake = Broken(cards(1000))
    util = GPUtil(nvml=fake)
    assert util.reason == "no GPU: NVML lists no device (Unknown Error)"
    assert fake.inits == fake.shutdowns == 1
