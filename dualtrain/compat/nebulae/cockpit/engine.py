"""Nebulae's ``nebulae.cockpit.Engine``: where a process computes, and ``coat`` / ``shell``."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from dualtrain.cockpit.engine import Engine as _Engine
from dualtrain.compat.nebulae.config import from_config
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
        given = from_config(config, "Engine", {"device": device, "ngpus": ngpus,
                            "least_mem": least_mem, "avail_gpus": avail_gpus,
                            "multi_piston": multi_piston})  # fmt: skip
        rank = None
        if config is not None:
            unknown = set(config) - set(given) - {"rank"}
            if unknown:
                raise bad_argument(
                    "config", dict(config), f"Engine's keys; {sorted(unknown)} are not"
                )
            rank = config.get("rank")
        device, ngpus, least_mem = given["device"], given["ngpus"], given["least_mem"]
        avail_gpus, multi_piston = given["avail_gpus"], given["multi_piston"]
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
