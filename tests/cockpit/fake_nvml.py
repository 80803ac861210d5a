"""A recorded NVML: pynvml's names answering with readings a test chooses.

NVML is hardware; this stands in for the driver's answers only (the objects nvidia-ml-py
returns: memory info with total/free/used bytes, utilization rates, PCI info with a bytes
bus id). Every reading it hands out is logged, so a test can recompute a summary.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MIB = 2**20


class NVMLError(Exception):
    pass


class NotSupportedError(NVMLError):
    pass


@dataclass
class Card:
    name: str = "NVIDIA H100 80GB HBM3"
    total_mib: float = 81559
    free_mib: float = 80000
    bus_id: str = "00000000:3B:00.0"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    utilization: list[float] = field(default_factory=lambda: [10.0, 50.0, 90.0])
    power_mw: list[float] | None = field(default_factory=lambda: [100000.0, 300000.0])
    temperature: list[float] = field(default_factory=lambda: [40.0, 60.0])
    pcie_kbps: list[float] | None = None  # None: not supported, as on many boards


class FakeNVML:
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(self, cards: list[Card], *, init_error: Exception | None = None) -> None:
        self.cards = cards
        self.init_error = init_error
        self.inits = self.shutdowns = 0
        self.log: dict[int, dict[str, list[float]]] = {i: {} for i in range(len(cards))}
        self._cycles = {
            (i, name): itertools.cycle(values)
            for i, card in enumerate(cards)
            for name in ("utilization", "power_mw", "temperature", "pcie_kbps")
            if (values := getattr(card, name))
        }
        self.lost = False  # True: every device call fails, as after "GPU is lost"

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        if self.lost:
            raise NVMLError("GPU is lost")
        return i

    def nvmlDeviceGetName(self, h: int) -> str:  # noqa: N802
        return self.cards[h].name

    def nvmlDeviceGetUUID(self, h: int) -> str:  # noqa: N802
        return self.cards[h].uuid

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:  # noqa: N802
        return SimpleNamespace(busId=self.cards[h].bus_id.encode())

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:  # noqa: N802
        c = self.cards[h]
        total, free = int(c.total_mib * MIB), int(c.free_mib * MIB)
        self._note(h, "memory_used_mib", (total - free) / MIB)
        return SimpleNamespace(total=total, free=free, used=total - free)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:  # noqa: N802
        value = self._next(h, "utilization")
        self._note(h, "utilization", value)
        return SimpleNamespace(gpu=int(value), memory=0)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:  # noqa: N802
        value = self._next(h, "power_mw")
        self._note(h, "power_w", value / 1000)
        return int(value)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:  # noqa: N802
        value = self._next(h, "temperature")
        self._note(h, "temperature_c", value)
        return int(value)

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:  # noqa: N802
        value = self._next(h, "pcie_kbps")
        self._note(h, "pcie_tx_mbps" if counter == 0 else "pcie_rx_mbps", value / 1000)
        return int(value)

    def _next(self, h: int, name: str) -> float:
        cycle = self._cycles.get((h, name))
        if cycle is None:
            raise NotSupportedError("Not Supported")
        return next(cycle)

    def _note(self, h: int, metric: str, value: float) -> None:
        self.log[h].setdefault(metric, []).append(value)
