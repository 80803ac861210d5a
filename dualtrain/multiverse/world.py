"""World: which process this is among how many, read from torchrun's, SLURM's or our own spawn.

A process joins a run through the environment its launcher set. torchrun (and Multiverse's
own spawn, which sets the same variables) gives ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; SLURM gives ``SLURM_PROCID``,
``SLURM_NTASKS`` and ``SLURM_LOCALID`` (the master address then comes from ``MASTER_ADDR``,
which a batch script exports). JAX's coordinator is ``JAX_COORDINATOR_ADDRESS`` when set,
else the master address one port above ``MASTER_PORT`` (torchrun's own store holds that one).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from dualtrain.errors import ArgumentError

__all__ = ["SPAWNED", "World", "free_port", "from_environment"]

# Set by Multiverse in the processes it spawns; holds the number of local devices (JAX).
SPAWNED = "DUALTRAIN_MULTIVERSE_SPAWNED"
_TORCHRUN = ("RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class World:
    """One process's place in a run.

    Attributes:
        processes: processes in the run (torch: one per device).
        rank: this process's index, 0 ... processes - 1.
        local_rank: its index on this host.
        local_processes: processes on this host.
        master_addr, master_port: where rank 0 listens (torch's store).
        source: "local" (this process alone), "spawned" (by Multiverse), "torchrun" or
            "slurm".
        coordinator: JAX's coordinator address ``host:port``; None lets
            ``jax.distributed.initialize`` find it (SLURM, Open MPI, Kubernetes).
        local_devices: the devices each process drives under JAX; 0: all it has.
    """

    processes: int = 1
    rank: int = 0
    local_rank: int = 0
    local_processes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    source: str = "local"
    coordinator: str | None = None
    local_devices: int = 0

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one that logs and writes checkpoints."""
        return self.rank == 0


def from_environment(environ: Mapping[str, str] | None = None) -> World | None:
    """The World a launcher described in `environ` (default ``os.environ``), or None.

    None means no launcher: this process is alone and Multiverse may spawn its workers.

    Raises:
        ArgumentError: a launcher's variables that are not integers, or out of range.
    """
    env = os.environ if environ is None else environ
    if all(name in env for name in _TORCHRUN):
        rank, processes = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK", rank)
        local_processes = _int(env, "LOCAL_WORLD_SIZE", processes)
        source = "spawned" if SPAWNED in env else "torchrun"
    elif "SLURM_PROCID" in env and _int(env, "SLURM_NTASKS", 1) > 1:
        rank, processes = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local_rank = _int(env, "SLURM_LOCALID", 0)
        local_processes = _int(env, "SLURM_NTASKS_PER_NODE", processes) if _plain(
            env.get("SLURM_NTASKS_PER_NODE", "")
        ) else processes  # fmt: skip
        source = "slurm"
    else:
        return None
    if not 0 <= rank < processes or not 0 <= local_rank < max(local_processes, 1):
        raise ArgumentError(
            f"the launcher's environment is inconsistent: rank {rank} of {processes} "
            f"processes, local rank {local_rank} of {local_processes}"
        )
    port = _int(env, "MASTER_PORT", 29500)
    addr = env.get("MASTER_ADDR", "")
    if not addr:
        if source == "slurm":  # JAX finds SLURM's coordinator itself; torch needs the address
            addr = "127.0.0.1" if processes == local_processes else ""
        else:
            addr = "127.0.0.1"
    coordinator = env.get("JAX_COORDINATOR_ADDRESS") or (f"{addr}:{port + 1}" if addr else None)
    return World(
        processes=processes, rank=rank, local_rank=local_rank,
        local_processes=local_processes, master_addr=addr, master_port=port, source=source,
        coordinator=coordinator, local_devices=_int(env, SPAWNED, 0) if SPAWNED in env else 0,
    )  # fmt: skip


def free_port() -> int:
    """A TCP port free on this host now (the OS picks it; bound and released at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _plain(text: str) -> bool:
    return text.isdigit()


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None:
        if default is None:
            raise ArgumentError(f"the environment variable {name} is missing")
        return default
    try:
        value = int(text)
    except ValueError:
        raise ArgumentError(
            f"the environment variable {name} must be an int; got {name}={text!r}"
        ) from None
    if value < 0:
        raise ArgumentError(f"the environment variable {name} must be >= 0; got {name}={text!r}")
    return value
