"""Nebulae's ``nebulae.cockpit.Engine``: where a process computes, and ``coat`` / ``shell``."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from dualtrain.cockpit.engine import Engine as _Engine
from dualtrain.errors import ArgumentError, bad_argument

__all__ = ["Engine", "latest"]

_LATEST: list[Engine] = []  # Nebulae's Engine rebound dock.coat / dock.shell to its own


def latest() -> Engine | None:
    """The Engine made last in this process: where ``dock.coat`` puts tensors (None: CPU)."""
    return _LATEST[0] if _LATEST else None


class Engine(_Engine):
    """Nebulae's Engine and its argument order, on dualtrain's.

    ``Engine(config=None, device=None, ngpus=1, least_mem=2048, avail_gpus=(),
    multi_piston=False)``.

    Args:
        config: a dict of the other arguments (Nebulae's first positional).
        device: "gpu" or "cpu"; "gpu" without a GPU falls back to the CPU, as dualtrain's
            Engine does (Nebulae raised).
        ngpus: GPUs on this node; a launcher's ``WORLD_SIZE`` overrides it, as in Nebulae.
        multi_piston: Nebulae's single-process DataParallel; refused: Multiverse runs a
            process per device.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        device: str | None = None,
        ngpus: int = 1,
        least_mem: float = 2048,
        avail_gpus: tuple[int, ...] = (),
        multi_piston: bool = False,
    ) -> None:
        if config is not None:
            if not isinstance(config, Mapping):
                raise bad_argument("config", config, "None or a dict of Engine's arguments")
            unknown = set(config) - {"device", "ngpus", "least_mem", "avail_gpus",
                                     "multi_piston", "rank"}  # fmt: skip
            if unknown:
                raise bad_argument(
                    "config", dict(config), f"Engine's keys; {sorted(unknown)} are not"
                )
            device = config.get("device", device)
            ngpus = config.get("ngpus", ngpus)
            least_mem = config.get("least_mem", least_mem)
            avail_gpus = config.get("avail_gpus", avail_gpus)
            multi_piston = config.get("multi_piston", multi_piston)
        rank = config.get("rank") if config is not None else None
        if not isinstance(device, str) or device.lower() not in ("gpu", "cpu"):
            raise bad_argument("device", device, "'gpu' or 'cpu'")
        if multi_piston:
            raise ArgumentError(
                "multi_piston=True (one process driving several GPUs) is not built: run "
                "Multiverse(launch, ngpus), one process a GPU"
            )
        world = os.environ.get("WORLD_SIZE")
        if world is not None and world.isdigit():
            ngpus = int(world)
        # Nebulae's config rank picks this process's GPU (-1: the launcher's, read as
        # Multiverse reads it)
        local = rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None
        super().__init__(device, ngpus, least_mem, tuple(avail_gpus), local_rank=local)
        _LATEST[:] = [self]

    def coat(self, datum: Any, as_const: bool = True) -> Any:
        """`datum` as a torch tensor on this Engine's device (requiring grad if not as_const)."""
        craft = importlib.import_module("dualtrain_torch.craft")
        return craft.coat(datum, as_const, device=self.torch_device)

    def shell(self, datum: Any, as_np: bool = True) -> Any:
        """A tensor back as NumPy (a single value as a Python number), or a CPU tensor."""
        craft = importlib.import_module("dualtrain_torch.craft")
        return craft.shell(datum, as_np)
