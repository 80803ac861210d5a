"""The rows of a JAX batch in a data-parallel step: placed over the mesh, or split for pmap.

The torch adapter's ``distributed.rows`` has the same role for its learner. `Joined` is what
the learner, the rows and the collectives use of the run (`JaxRuntime` meets it): they
annotate against it, not against the runtime's class, which imports them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.multiverse.seams import Runtime

if TYPE_CHECKING:
    from dualtrain_jax.transfer import Transfer

__all__ = [
    "AXIS", "Joined", "PmapLayout", "batch_rows", "check_rows", "host_rows", "mean_floats", "place",
    "split_rows",
]  # fmt: skip

AXIS = "data"  # the mesh's one axis: replicas of the model, shards of the batch


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


def place(rt: Joined, transfer: Transfer, batch: Any) -> Any:
    """`batch` (this process's rows) as global arrays split by rows over the mesh.

    With one process, NumPy rows are left for the jitted step to place (its in-sharding
    splits them, in C++, as a hand-written ``jit`` call does); their rows are checked here.
    """
    leaves, treedef = jax.tree.flatten(batch)
    out: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, jax.Array) and leaf.sharding == rt.batched:
            out.append(leaf)
            continue
        x = leaf if isinstance(leaf, jax.Array) and rt.processes == 1 else np.asarray(leaf)
        check_rows(x.shape, rt.local_devices)
        out.append(x if rt.processes == 1 and isinstance(x, np.ndarray) else transfer(x))
    return jax.tree.unflatten(treedef, out)


class PmapLayout:
    """pmap's forms of a runtime's arrays: per-device copies and per-device rows."""

    def __init__(self, runtime: Joined) -> None:
        self.runtime = runtime

    def rows(self, x: Any) -> Any:
        """Rows `x` as pmap's ``(devices, rows per device, ...)``: on the devices if there."""
        rt = self.runtime
        if isinstance(x, jax.Array) and rt.processes == 1:
            check_rows(x.shape, rt.local_devices)
            return self.unstack(x)  # split where it lies (a Tank's batch): no host copy
        return split_rows(host_rows(x), rt.local_devices)

    @functools.cached_property
    def stack(self) -> Any:
        """Replicated arrays as pmap's per-device copies, where pmap leaves its results."""
        rt = self.runtime
        mine = [d for d in rt.mesh.devices.flat if d.process_index == rt.rank]
        local = NamedSharding(Mesh(np.array(mine), (AXIS,)), PartitionSpec(AXIS))
        n = len(mine)

        def stack(tree: Any) -> Any:
            if rt.processes > 1:  # a global array's local copy, then onto this process's devices
                tree = jax.tree.map(host_rows, tree)
            return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), tree)

        return (
            jax.jit(stack, out_shardings=local)
            if rt.processes == 1
            else (lambda tree: jax.device_put(stack(tree), local))
        )

    @functools.cached_property
    def unstack(self) -> Any:
        n, rt = self.runtime.nworld, self.runtime
        return jax.jit(
            lambda x: x.reshape(n, x.shape[0] // n, *x.shape[1:]), out_shardings=rt.batched
        )

    @functools.cached_property
    def first(self) -> Any:
        """Device 0's copy of pmap's per-device results, replicated over the mesh."""
        return jax.jit(
            lambda t: jax.tree.map(lambda x: x[0], t), out_shardings=self.runtime.replicated
        )


def host_rows(x: Any) -> np.ndarray:
    """This process's rows of `x` on the host (a global array: its local shards, in order)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
        return np.concatenate([np.asarray(s.data) for s in shards])
    return np.asarray(x)


def batch_rows(targets: Any) -> int:
    """The rows of a batch (its targets' first axis); ArgumentError for none."""
    leaves = jax.tree.leaves(targets)
    shape = tuple(np.shape(leaves[0])) if leaves else ()
    if not shape or shape[0] == 0:
        # No rows: without a mask the mean would be 0 / 0, and NaN would reach the params.
        raise bad_argument("targets", targets, "rows (B, ...) with B >= 1")
    return int(shape[0])


def split_rows(x: np.ndarray, n: int) -> np.ndarray:
    """Rows ``(b, ...)`` as ``(n, b // n, ...)``: one slice per device."""
    check_rows(x.shape, n)
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def check_rows(shape: tuple[int, ...], n: int) -> None:
    """Refuses rows that do not split over the `n` devices this process drives."""
    if not shape or shape[0] % n:
        raise ArgumentError(
            f"inputs, targets and mask must hold rows that split over the {n} devices this "
            f"process drives; got an array of shape {shape} (use a batch size that is a "
            "multiple of it, a Tank with drop_last=True or pad=True)"
        )


def mean_floats(x: Any) -> Any:
    """A float leaf's mean over the pmap axis (BatchNorm's batch statistics); others as given."""
    return jax.lax.pmean(x, AXIS) if jnp.issubdtype(x.dtype, jnp.floating) else x
