"""`Engine`: the devices a process trains on, picked once and handed to either framework.

Nebulae's ``Engine(device, ngpus, least_mem, available_gpus)``: it asks `GPUtil` for GPUs
with room (or takes the ones named), falls back to the CPU with a warning when none
qualifies, and under a launcher (torchrun, SLURM, Multiverse) gives each local rank its own
GPU of those picked. The frameworks' device objects come from the adapters' ``cockpit`` parts,
imported only when asked for (`torch_device`, `jax_devices`), so the Engine itself imports
neither framework. Nothing here sets ``CUDA_VISIBLE_DEVICES``: changing it after CUDA started
does nothing, and before, it would renumber the devices under the caller's feet.
"""

from __future__ import annotations

import warnings
from typing import Any

from dualtrain.cockpit.gputil import GPUtil
from dualtrain.cockpit.nvml import GPUInfo
from dualtrain.cockpit.seams import cockpit_part
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.multiverse.world import from_environment
from dualtrain.validate import check_finite, check_int

__all__ = ["CPU", "GPU", "Engine"]

CPU = "CPU"
GPU = "GPU"


class Engine:
    """Where this process computes: its GPU of those picked, or the CPU.

    Args:
        device: ``"GPU"`` or ``"CPU"`` (`dualtrain.cockpit.GPU` / `CPU`; any case).
        ngpus: GPUs to pick on this node (one per local rank; ``mv.nworld`` under
            Multiverse). ``ngpu``, Nebulae's code spelling, is taken too.
        least_mem: MiB a GPU must have free to be picked.
        available_gpus: NVML indices (``nvidia-smi``'s numbering) to use instead of picking;
            their free memory is not checked.
        gputil: the `GPUtil` to ask (default: a new one).
        local_rank: this process's rank on the node (default: the launcher's, read as
            Multiverse reads it: torchrun's, SLURM's or Multiverse's variables; else 0).

    Attributes:
        device: ``"GPU"`` or ``"CPU"``: what it runs on after any fallback.
        gpus: the GPUs picked on this node, in NVML order ([] on the CPU).
        gpu: this process's GPU (``gpus[local_rank]``), None on the CPU.
        local_rank: this process's rank on the node.
    """

    def __init__(
        self,
        device: str = CPU,
        ngpus: int = 1,
        least_mem: float = 2048,
        available_gpus: tuple[int, ...] = (),
        *,
        ngpu: int | None = None,
        gputil: GPUtil | None = None,
        local_rank: int | None = None,
    ) -> None:
        if not isinstance(device, str) or device.upper() not in (CPU, GPU):
            raise bad_argument("device", device, "'GPU' or 'CPU'")
        if ngpu is not None:
            if ngpus != 1:
                raise ArgumentError(
                    f"ngpus={ngpus!r} and ngpu={ngpu!r} name the same setting; give one"
                )
            ngpus = ngpu
        ngpus = check_int("ngpus", ngpus, 1)
        check_finite("least_mem", least_mem, 0, expected="a number of MiB >= 0")
        if not isinstance(available_gpus, (tuple, list)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in available_gpus
        ):
            raise bad_argument("available_gpus", available_gpus, "a tuple of GPU indices >= 0")
        if len(set(available_gpus)) != len(available_gpus):
            raise bad_argument("available_gpus", available_gpus, "indices without repeats")
        self.local_rank: int = _local_rank(local_rank)
        self.device = device.upper()
        self.gpus: list[GPUInfo] = []
        self.gpu: GPUInfo | None = None
        if self.device == CPU:
            return
        util = gputil if gputil is not None else GPUtil()
        if available_gpus:
            listed = {g.index: g for g in util.gpus()}
            missing = [i for i in available_gpus if i not in listed]
            if listed and missing:
                raise bad_argument(
                    "available_gpus", tuple(available_gpus), f"indices among {sorted(listed)}"
                )
            self.gpus = [listed[i] for i in sorted(available_gpus) if i in listed]
            why = util.reason or "none of them is listed"
        else:
            self.gpus = util.available(ngpus, least_mem)  # checks least_mem
            why = util.reason or f"no GPU has {least_mem} MiB free"
        if not self.gpus:
            warnings.warn(f"Engine: {why}; running on the CPU", RuntimeWarning, stacklevel=2)
            self.device = CPU
            return
        if self.local_rank >= len(self.gpus):
            raise ArgumentError(
                f"local rank {self.local_rank} needs a GPU of its own, and the Engine has "
                f"{len(self.gpus)} (ngpus={ngpus}): pass ngpus=mv.nworld under Multiverse, "
                "or fewer processes per node"
            )
        self.gpu = self.gpus[self.local_rank]

    def __repr__(self) -> str:
        if self.gpu is None:
            return "Engine(device='CPU')"
        return (
            f"Engine(device='GPU', gpu={self.gpu.index} {self.gpu.name!r}, "
            f"local_rank={self.local_rank}, gpus={[g.index for g in self.gpus]})"
        )

    # ---- the frameworks' devices ---------------------------------------------------------

    @property
    def cuda_ordinals(self) -> tuple[int, ...]:
        """CUDA's numbers of the GPUs picked (what ``cuda:<n>`` and JAX's ids use).

        Raises:
            ArgumentError: a picked GPU whose CUDA number this process cannot know (hidden by
                ``CUDA_VISIBLE_DEVICES``, or mixed models without ``CUDA_DEVICE_ORDER``).
        """
        unknown = [g for g in self.gpus if g.cuda is None]
        if unknown:
            g = unknown[0]
            raise ArgumentError(
                f"GPU {g.index} ({g.name}, {g.pci_bus_id}) has no CUDA number in this process: "
                "it is hidden by CUDA_VISIBLE_DEVICES, or the node mixes GPU models; set "
                "CUDA_DEVICE_ORDER=PCI_BUS_ID before starting, or pass available_gpus"
            )
        return tuple(g.cuda for g in self.gpus if g.cuda is not None)

    @property
    def cuda_ordinal(self) -> int | None:
        """This process's GPU as CUDA numbers it; None on the CPU."""
        if self.gpu is None:
            return None
        return self.cuda_ordinals[self.local_rank]

    @property
    def torch_device(self) -> Any:
        """This process's ``torch.device`` (``cuda:<n>`` or ``cpu``); imports torch."""
        part = cockpit_part("torch")
        ordinal = self.cuda_ordinal
        return part.devices(() if ordinal is None else (ordinal,))[0]

    @property
    def jax_devices(self) -> list[Any]:
        """JAX devices of every GPU picked (the CPU's first device on the CPU); imports jax."""
        return cockpit_part("jax").devices(self.cuda_ordinals if self.gpu is not None else ())

    @property
    def jax_device(self) -> Any:
        """This process's JAX device; imports jax."""
        ordinal = self.cuda_ordinal
        part = cockpit_part("jax")
        return part.devices(() if ordinal is None else (ordinal,))[0]


def _local_rank(rank: Any) -> int:
    if rank is None:  # torchrun's, SLURM's or Multiverse's variables; 0 outside a launcher
        world = from_environment()
        return 0 if world is None else world.local_rank
    return check_int("local_rank", rank, 0)
