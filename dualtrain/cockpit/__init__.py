"""The cockpit: the devices a run uses (`Engine`) and what the GPUs do (`GPUtil`, on NVML)."""

from __future__ import annotations

from dualtrain.cockpit.engine import CPU, GPU, Engine
from dualtrain.cockpit.gputil import GPUInfo, GPUtil, Stat

__all__ = ["CPU", "GPU", "Engine", "GPUInfo", "GPUtil", "Stat"]
