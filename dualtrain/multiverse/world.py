"""World: which process this is among how many, read from torchrun's, SLURM's or Multiverse's.

A process joins a run through the environment its launcher set. torchrun (and the agent that
Multiverse launches through, which sets the same variables) gives ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. A task of an
``srun`` step gets ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and
the tasks per node (the batch script itself, which has no step, is no worker); over several
hosts torch's master address comes from ``MASTER_ADDR``, which the batch script exports.
JAX's coordinator is ``JAX_COORDINATOR_ADDRESS`` when set, else the master address one port
above ``MASTER_PORT`` (torchrun's own store holds that one), else (SLURM over several hosts)
left to ``jax.distributed.initialize``, which finds SLURM's.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from dualtrain.errors import ArgumentError
from dualtrain.multiverse.devices import with_devices

__all__ = ["RESTARTS", "SPAWNED", "World", "free_port", "from_environment"]

# Set by Multiverse in the workers it launches; holds the number of local devices (JAX).
SPAWNED = "DUALTRAIN_MULTIVERSE_SPAWNED"
# The attempt a worker belongs to, where its agent has no variable of its own for it (torch's
# agent, and torchrun, set TORCHELASTIC_RESTART_COUNT instead).
RESTARTS = "DUALTRAIN_MULTIVERSE_RESTART_COUNT"
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
        agent: torch's elastic agent serves the run's store at ``MASTER_ADDR:MASTER_PORT``
            (``TORCHELASTIC_USE_AGENT_STORE``: torchrun, or Multiverse through the agent).
        restart_count: how many times the run was started again after a failure (the
            agent's ``TORCHELASTIC_RESTART_COUNT``, or ``RESTARTS`` of one without it).
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
    agent: bool = False
    restart_count: int = 0

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
    elif "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and _int(env, "SLURM_NTASKS", 1) > 1:
        # A task of an srun step (a batch script itself is no worker: it has no step id).
        rank, processes = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local_rank = _int(env, "SLURM_LOCALID", 0)
        per_node = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE")
                                   or env.get("SLURM_TASKS_PER_NODE", ""))  # fmt: skip
        node = _int(env, "SLURM_NODEID", 0)
        local_processes = per_node[node] if node < len(per_node) else processes
        source = "slurm"
    else:
        return None
    if not 0 <= rank < processes or not 0 <= local_rank < max(local_processes, 1):
        names = ("RANK", "LOCAL_RANK") if source != "slurm" else ("SLURM_PROCID", "SLURM_LOCALID")
        raise ArgumentError(
            f"the launcher's environment is inconsistent: {names[0]}={rank} of {processes} "
            f"processes, {names[1]}={local_rank} of {local_processes} on this host"
        )
    port = _int(env, "MASTER_PORT", 29500)
    addr = env.get("MASTER_ADDR", "")
    one_host = processes == local_processes
    if not addr and (source != "slurm" or one_host):
        addr = "127.0.0.1"
    # JAX: the given coordinator, else one port above torch's; under SLURM without an
    # address, None lets jax.distributed.initialize find SLURM's coordinator itself.
    coordinator = env.get("JAX_COORDINATOR_ADDRESS") or (f"{addr}:{port + 1}" if addr else None)
    return World(
        processes=processes, rank=rank, local_rank=local_rank,
        local_processes=local_processes, master_addr=addr, master_port=port, source=source,
        coordinator=coordinator, local_devices=_int(env, SPAWNED, 0) if SPAWNED in env else 0,
        agent=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", _int(env, RESTARTS, 0)),
    )  # fmt: skip


def free_port() -> int:
    """A TCP port free on this host now (the OS picks it; bound and released at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tasks_per_node(text: str) -> list[int]:
    """SLURM's tasks per node, "2(x3),1" -> [2, 2, 2, 1]; [] when absent or unreadable."""
    counts: list[int] = []
    for part in filter(None, text.split(",")):
        number, _, repeat = part.partition("(x")
        if not number.isdigit() or (repeat and not repeat.rstrip(")").isdigit()):
            return []
        counts += [int(number)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts


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


def run_environment(processes: int, local_devices: int, host_devices: bool) -> dict[str, str]:
    """The variables every worker of a run of `processes` that Multiverse launches starts with.

    Handed to the adapter's agent (`Launch.environment`), which sets them in each worker's
    environment before it starts (not in the launching process's for the run): the devices
    each process drives (0: one); with `host_devices`, the XLA flag asking for as many host
    devices; gloo quiet; the cores shared, not multiplied.
    """
    base = {SPAWNED: str(local_devices)}
    if host_devices:
        base["XLA_FLAGS"] = with_devices(os.environ.get("XLA_FLAGS", ""), local_devices)
    if "TORCH_CPP_LOG_LEVEL" not in os.environ:  # gloo's per-peer lines at every join
        base["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun's rule: cores shared, not multiplied
        base["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // processes))
    return base


def rank_environments(processes: int, attempt: int) -> list[dict[str, str]]:
    """The variables torchrun sets, for each of `processes` workers on this host, rank by rank.

    For an agent that has none of its own to set: rank 0's store on a free localhost port;
    `attempt`, the restart count the workers see.
    """
    base = {
        "WORLD_SIZE": str(processes), "LOCAL_WORLD_SIZE": str(processes),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), RESTARTS: str(attempt),
    }  # fmt: skip
    return [{**base, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(processes)]
