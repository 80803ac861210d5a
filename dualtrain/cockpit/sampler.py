"""`Sampler`: GPU readings taken every few seconds by a background thread.

The thread holds the sampler, never the `GPUtil` that started it, so a GPUtil dropped while
monitoring is still collected: its finalizer stops the thread (`stop`), then closes NVML.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType

from dualtrain.cockpit.nvml import Reading, read

__all__ = ["Sampler", "shut"]


class Sampler:
    """Readings of the GPUs `indices` (NVML), taken now and every `sec` seconds after."""

    def __init__(self, nvml: ModuleType, indices: list[int]) -> None:
        self.nvml = nvml
        self.samples: dict[int, list[Reading]] = {index: [] for index in indices}
        self.failure = ""  # why sampling stopped early ("" while it runs or ran to the end)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """One reading of every GPU, now (the caller's thread)."""
        for index, readings in self.samples.items():
            readings.append(read(self.nvml, index))

    def start(self, sec: float) -> None:
        """Samples every `sec` seconds in a daemon thread until `stop`."""
        self._thread = threading.Thread(
            target=self._run, args=(sec,), name="dualtrain-gputil", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread (at once: it waits on an event) and joins it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    @property
    def running(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None

    def _run(self, sec: float) -> None:
        next_at = time.monotonic() + sec
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            try:
                self.sample()
            except Exception as err:  # a device gone mid-run: keep what was sampled
                self.failure = f"monitoring stopped early: {err}"
                return
            next_at = max(next_at + sec, time.monotonic())  # behind: no burst to catch up


def shut(sampler_box: list[Sampler | None], nvml: ModuleType) -> None:
    """A GPUtil's finalizer: stops its sampler if one runs, then balances its NVML init."""
    from dualtrain.cockpit.nvml import close_nvml

    sampler = sampler_box[0]
    if sampler is not None:
        sampler.stop()
    close_nvml(nvml)
