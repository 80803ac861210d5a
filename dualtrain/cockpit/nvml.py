"""Reading GPUs through NVML (``nvidia-ml-py``): which devices there are and what they report.

No subprocess and no ``nvidia-smi``: NVML is the library ``nvidia-smi`` itself reads. Every
reading that a driver or a device does not support comes back as None, never an exception,
so a monitor keeps going on a card without power sensors or PCIe counters.

Nothing here raises for a missing GPU: `open_nvml` returns the module, or None and a
one-line reason (no package, no driver, no device).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["GPUInfo", "Reading", "close_nvml", "devices", "open_nvml", "read"]

_MIB = 2**20
_lock = threading.Lock()
_opened: dict[int, int] = {}  # id(module) -> how many GPUtils hold it open (nvmlInit is counted)


@dataclass(frozen=True)
class GPUInfo:
    """One GPU as NVML lists it (PCI bus order).

    Attributes:
        index: NVML's index (PCI bus order; ``nvidia-smi`` shows the same).
        cuda: the CUDA ordinal this process would use for it (``cuda:<cuda>``), None where
            it is hidden by ``CUDA_VISIBLE_DEVICES`` or cannot be known (mixed GPU models
            without ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: CUDA then orders fastest first).
        name: the product name.
        total_mib: memory, MiB.
        free_mib: free memory when listed, MiB.
        pci_bus_id: ``domain:bus:device.function``, e.g. ``00000000:3B:00.0``.
        uuid: ``GPU-...``, what ``CUDA_VISIBLE_DEVICES`` also accepts.
    """

    index: int
    cuda: int | None
    name: str
    total_mib: float
    free_mib: float
    pci_bus_id: str
    uuid: str


@dataclass(frozen=True)
class Reading:
    """One sample of one GPU; None where the device or driver does not report it.

    Attributes:
        utilization: percent of the interval a kernel ran (NVML's "GPU-Util"; not SM
            occupancy).
        memory_used_mib: MiB in use.
        power_w: board power, W.
        temperature_c: GPU core temperature, degrees C.
        pcie_tx_mbps / pcie_rx_mbps: PCIe throughput over NVML's 20 ms window, MB/s.
    """

    utilization: float | None
    memory_used_mib: float | None
    power_w: float | None
    temperature_c: float | None
    pcie_tx_mbps: float | None
    pcie_rx_mbps: float | None


def open_nvml(nvml: ModuleType | None = None) -> tuple[ModuleType | None, str]:
    """NVML initialised, or None and why not (one line).

    Args:
        nvml: an NVML binding with pynvml's names; default the ``pynvml`` module of
            ``nvidia-ml-py``.
    """
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return None, "no GPU monitoring: nvidia-ml-py is not installed"
    try:
        with _lock:
            nvml.nvmlInit()
            _opened[id(nvml)] = _opened.get(id(nvml), 0) + 1
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no GPU here
        return None, f"no GPU: NVML is not available ({_text(err)})"
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as err:  # started, but cannot list: release the init it took
        close_nvml(nvml)
        return None, f"no GPU: NVML lists no device ({_text(err)})"
    if count == 0:
        close_nvml(nvml)
        return None, "no GPU: NVML lists no device"
    return nvml, ""


def close_nvml(nvml: ModuleType) -> None:
    """Balances one `open_nvml` (NVML counts its inits; the last shutdown closes it)."""
    with _lock:
        held = _opened.get(id(nvml), 0)
        if held <= 0:
            return
        _opened[id(nvml)] = held - 1
        with contextlib.suppress(Exception):  # a driver gone since: nothing left to close
            nvml.nvmlShutdown()


def devices(nvml: ModuleType, environ: dict[str, str]) -> list[GPUInfo]:
    """Every GPU NVML lists, with its CUDA ordinal under `environ` (see `GPUInfo.cuda`)."""
    found = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        found.append(
            GPUInfo(
                index=i,
                cuda=None,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                total_mib=memory.total / _MIB,
                free_mib=memory.free / _MIB,
                pci_bus_id=_text(pci.busId),
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            )
        )
    ordinals = cuda_ordinals(found, environ)
    return [
        GPUInfo(
            g.index, ordinals.get(g.index), g.name, g.total_mib, g.free_mib, g.pci_bus_id, g.uuid
        )
        for g in found
    ]


def cuda_ordinals(gpus: list[GPUInfo], environ: dict[str, str]) -> dict[int, int]:
    """NVML index -> CUDA ordinal, as CUDA enumerates under `environ`.

    CUDA orders devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; identical
    models tie and keep PCI order, so the order is known when the order variable says PCI or
    all devices are one model. ``CUDA_VISIBLE_DEVICES`` then picks and reorders them: by
    ordinal or UUID (prefix); like CUDA, an entry that names no device ends the list.
    """
    by_bus = sorted(gpus, key=lambda g: _bus_key(g.pci_bus_id))
    pci_order = environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID"
    if not pci_order and len({g.name for g in gpus}) > 1:
        return {}  # fastest first among different models: only CUDA itself knows
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return {g.index: ordinal for ordinal, g in enumerate(by_bus)}
    chosen: list[GPUInfo] = []
    for entry in (e.strip() for e in visible.split(",")):
        match = _visible_entry(entry, by_bus)
        if match is None or match in chosen:
            break  # CUDA ignores the rest of the list after an invalid or repeated entry
        chosen.append(match)
    return {g.index: ordinal for ordinal, g in enumerate(chosen)}


def read(nvml: ModuleType, index: int) -> Reading:
    """One sample of GPU `index`; readings it does not support are None."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    util = _try(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    memory = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    power = _try(lambda: nvml.nvmlDeviceGetPowerUsage(handle))  # mW
    temp = _try(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    tx = _try(lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES))
    rx = _try(lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES))
    return Reading(
        utilization=None if util is None else float(util.gpu),
        memory_used_mib=None if memory is None else memory.used / _MIB,
        power_w=None if power is None else power / 1000,
        temperature_c=None if temp is None else float(temp),
        pcie_tx_mbps=None if tx is None else tx / 1000,  # NVML: KB/s
        pcie_rx_mbps=None if rx is None else rx / 1000,
    )


def _try(call: Any) -> Any:
    try:
        return call()
    except Exception:  # NVMLError_NotSupported and kin: this reading is absent
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_key(bus_id: str) -> tuple[int, ...]:
    """``0000:3B:00.0`` (any domain width) as numbers, for PCI order."""
    try:
        domain, bus, rest = bus_id.split(":")
        device, function = rest.split(".")
        return (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))
    except ValueError:
        return (1 << 32,)  # unparseable: last


def _visible_entry(entry: str, by_bus: list[GPUInfo]) -> GPUInfo | None:
    if entry.isdigit():
        ordinal = int(entry)
        return by_bus[ordinal] if ordinal < len(by_bus) else None
    if entry.startswith("GPU-"):
        hits = [g for g in by_bus if g.uuid.startswith(entry)]
        return hits[0] if len(hits) == 1 else None  # an ambiguous prefix names none
    return None
