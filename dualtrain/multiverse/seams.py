"""What Multiverse asks of an adapter's ``distributed`` module: join a run, then a Runtime.

`dualtrain.backends.load_part(name, "distributed")` returns the adapter's module typed as
`DistributedPart`; ``tests/test_seams.py`` checks both adapters against it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from dualtrain.multiverse.world import World

__all__ = ["DistributedPart", "Runtime"]


class Runtime(Protocol):
    """One process's handle on a joined run (what `DistributedPart.join` returns).

    Attributes:
        nworld: data-parallel replicas in the run: torch, its processes; JAX, the devices
            of the mesh over all processes.
        local_devices: the replicas this process drives (torch 1; JAX its mesh devices).
    """

    nworld: int
    local_devices: int

    def scope(self) -> AbstractContextManager[Any]:
        """A context in which the run's devices are the default (JAX: its mesh)."""
        ...

    def sync_model(self, model: Any, /, options: dict[str, Any]) -> Any:
        """`model` with rank 0's parameters on every rank, its gradients mean-reduced.

        torch: a module (a realized Craft or any ``nn.Module``) wrapped in DDP
        (``options``: ``bucket_cap_mb``, ``find_unused_parameters``, ``broadcast_buffers``);
        JAX: a realized module or a pytree of arrays, replicated over the mesh.
        """
        ...

    def unwrap(self, model: Any, /) -> Any:
        """The model as it is without the run's wrapping (what checkpoints take)."""
        ...

    def batch_device(self, to: str, /) -> Any:
        """Where a Tank serving `to` ("numpy", "torch", "jax") delivers (None: the host)."""
        ...

    def reduce(self, value: Any, /, aggregate: bool) -> Any:
        """`value` (a scalar, an array, or a tuple, list or dict of them) over processes.

        Summed when `aggregate`, else averaged; returned in the kind it came in.
        """
        ...

    def gather_object(self, obj: Any, /) -> list[Any]:
        """Every process's `obj` (picklable), in rank order, on every process."""
        ...

    def barrier(self) -> None:
        """Waits until every process reaches it."""
        ...

    def seed(self, seed: int, /) -> Any:
        """Seeds the framework's global RNG with `seed` (already per rank); its seed object.

        torch: the int; JAX: ``jax.random.key(seed)``.
        """
        ...

    def no_sync(self, model: Any, /) -> AbstractContextManager[Any]:
        """A context in which backward passes accumulate gradients without reducing them."""
        ...

    def learner(
        self,
        model: Any,
        /,
        optimizer: Any,
        loss_fn: Callable[..., Any] | None,
        engine: str,
    ) -> Any:
        """A data-parallel learner: ``.step(inputs, targets, mask=None) -> loss``.

        The loss is the mean over the global batch (every replica's rows; with `mask`, the
        rows it marks True), and one step equals a single-replica step on that batch.
        `engine` (JAX): "jit" (sharded jit) or "pmap"; torch takes "jit" only (DDP).
        """
        ...

    def leave(self) -> None:
        """Leaves the run (destroys the process group; JAX's runtime stays for the process)."""
        ...


class DistributedPart(Protocol):
    """``dualtrain_<name>.distributed``, used by `dualtrain.Multiverse`."""

    def join(self, world: World, /, timeout: float, on_step: Callable[[], None]) -> Runtime:
        """Joins the run `world` describes and returns this process's Runtime.

        torch: ``init_process_group`` (gloo on the CPU, nccl on CUDA; a world of one process
        uses an in-memory store). JAX: ``jax.distributed.initialize`` when there are several
        processes, then a one-axis mesh ("data") over every process's devices.
        `timeout` (seconds) bounds the joining and, under torch, every collective. The runtime calls
        `on_step` once per training step: each learner step, and (torch) each forward of a
        synced model in training mode; Multiverse counts them to name the step in errors.
        """
        ...
