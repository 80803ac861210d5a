"""`GPUtil`: which GPUs have room, and what they did while a job ran (Nebulae's GPUtil).

Built on NVML (`dualtrain.cockpit.nvml`): no ``nvidia-smi`` subprocess, no ``pkill``, devices
named by PCI bus id and mapped to CUDA ordinals. Without a GPU, a driver or nvidia-ml-py,
every call answers empty and `reason` says why in one line; nothing raises for that.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any

from dualtrain.cockpit.nvml import GPUInfo, Reading, devices, open_nvml
from dualtrain.cockpit.sampler import Sampler, shut
from dualtrain.errors import ArgumentError
from dualtrain.validate import check_finite, check_int

__all__ = ["GPUInfo", "GPUtil", "Stat"]

_METRICS = tuple(f.name for f in fields(Reading))


@dataclass(frozen=True)
class Stat:
    """A metric over a monitored span: its mean over the samples and its peak."""

    mean: float
    peak: float


class GPUtil:
    """GPU availability and monitoring through NVML.

    Args:
        nvml: an NVML binding with pynvml's names (default: nvidia-ml-py's ``pynvml``).

    Attributes:
        reason: why there is nothing to report ("" when NVML lists devices).
    """

    def __init__(self, *, nvml: ModuleType | None = None) -> None:
        self._nvml, self.reason = open_nvml(nvml)
        # The sampler lives in a box the finalizer also holds, never holding the GPUtil.
        self._box: list[Sampler | None] = [None]
        self._names: dict[int, str] = {}
        if self._nvml is not None:
            # Collected, a GPUtil stops its sampler; NVML counts inits: the last one closes it.
            self._finalizer = weakref.finalize(self, shut, self._box, self._nvml)

    def __repr__(self) -> str:
        if self._nvml is None:
            return f"GPUtil({self.reason!r})"
        return f"GPUtil({len(self.gpus())} GPUs, monitoring={self.monitoring})"

    def gpus(self) -> list[GPUInfo]:
        """Every GPU, in NVML (PCI bus) order, with its free memory now; [] without one."""
        if self._nvml is None:
            return []
        return devices(self._nvml, dict(os.environ))

    def available(self, ngpus: Any = 1, least_mem: Any = 2048) -> list[GPUInfo]:
        """GPUs with at least `least_mem` MiB free: the `ngpus` with most free memory.

        Args:
            ngpus: how many to pick (>= 1).
            least_mem: MiB that must be free (>= 0).

        Returns:
            Up to `ngpus` devices in NVML order; fewer (possibly none) when fewer qualify.
        """
        ngpus = check_int("ngpus", ngpus, 1)
        least_mem = check_finite("least_mem", least_mem, 0, expected="a number of MiB >= 0")
        room = [g for g in self.gpus() if g.free_mib >= least_mem]
        picked = sorted(room, key=lambda g: (-g.free_mib, g.index))[:ngpus]
        return sorted(picked, key=lambda g: g.index)

    # ---- monitoring ----------------------------------------------------------------------

    @property
    def monitoring(self) -> bool:
        """Whether a `monitor` sampler is running."""
        sampler = self._box[0]
        return sampler is not None and sampler.running

    def monitor(self, sec: Any = 5) -> None:
        """Starts sampling every GPU every `sec` seconds in a background thread.

        Utilisation, memory used, power, temperature and PCIe throughput; `status()` stops
        it and summarises. Without a GPU nothing starts (see `reason`).

        Raises:
            ArgumentError: `sec` not a positive number; a monitor already running.
        """
        sec = check_finite("sec", sec, 0, low_open=True, expected="a positive number of seconds")
        if self.monitoring:
            raise ArgumentError("monitor() is already running; call status() to stop it first")
        if self._nvml is None:
            return
        try:
            sampler = self._start()
            sampler.sample()  # the start of the span, so a short span still has a reading
        except Exception as err:  # a device gone since the last call: nothing to monitor
            self.reason = f"no monitoring: {err}"
            self._box[0] = None
            return
        sampler.start(float(sec))

    def status(self) -> dict[int, dict[str, Any]]:
        """Stops the monitor and summarises it per GPU (one reading now if none ran).

        Returns:
            ``{nvml_index: {"name": str, "samples": int, "<metric>": Stat | None}}`` with the
            metrics of `dualtrain.cockpit.nvml.Reading` (None: never reported); {} without
            a GPU.
        """
        if self._nvml is None:
            return {}
        sampler = self._box[0]
        try:
            if sampler is None or not sampler.running:
                sampler = self._start()
            else:
                sampler.stop()
            if not sampler.failure:
                sampler.sample()  # the end of the span (or the one reading)
        except Exception as err:  # a device gone: keep what was sampled
            if sampler is None:
                self.reason = f"no monitoring: {err}"
                return {}
            sampler.failure = sampler.failure or f"monitoring stopped early: {err}"
        summary: dict[int, dict[str, Any]] = {}
        for index, readings in sampler.samples.items():
            entry: dict[str, Any] = {"name": self._names[index], "samples": len(readings)}
            for metric in _METRICS:
                values = [v for r in readings if (v := getattr(r, metric)) is not None]
                entry[metric] = Stat(sum(values) / len(values), max(values)) if values else None
            summary[index] = entry
        if sampler.failure:
            self.reason = sampler.failure
        return summary

    def _start(self) -> Sampler:
        assert self._nvml is not None
        self.reason = ""
        self._box[0] = None
        self._names = {g.index: g.name for g in self.gpus()}
        sampler = self._box[0] = Sampler(self._nvml, list(self._names))
        return sampler
