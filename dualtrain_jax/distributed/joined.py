"""What the learner, the rows and the collectives use of a joined JAX run (`JaxRuntime`).

They annotate against this Protocol, not the runtime's class, which imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from dualtrain.multiverse.seams import Runtime

if TYPE_CHECKING:
    from jax.sharding import Mesh, NamedSharding

__all__ = ["Joined"]


class Joined(Runtime, Protocol):
    """A `Runtime` over a one-axis JAX mesh.

    Attributes:
        mesh: the mesh over all processes' devices.
        processes, rank: the processes in the run and this one's index.
        replicated, batched: the mesh's shardings of models and of batches' rows.
        on_step: called once per learner step.
    """

    mesh: Mesh
    processes: int
    rank: int
    replicated: NamedSharding
    batched: NamedSharding
    on_step: Callable[[], None]

    def replicate(self, tree: Any, *, broadcast: bool = True) -> Any:
        """`tree` replicated over the mesh: process 0's arrays (else each process's own)."""
        ...
