"""Multiverse under JAX: one process's handle on a data-parallel run over a device mesh.

`join` starts JAX's multi-controller runtime when the run has several processes
(``jax.distributed.initialize``; on the CPU its collectives are gloo's) and builds a one-axis
mesh ``("data",)`` over the devices every process drives. The `JaxRuntime` it returns
replicates models over the mesh (``NamedSharding(mesh, P())``), shards batches over its
axis (``P("data")``) and makes data-parallel learners (`dualtrain_jax.distributed.learner`):
XLA inserts the gradient all-reduce into a sharded ``jit`` step, or ``jax.pmap`` runs the same
step with ``lax.psum``. The torch adapter's ``distributed`` module has the same names.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dualtrain.craft import Craft
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.multiverse.seams import Steps
from dualtrain.multiverse.world import World
from dualtrain_jax.distributed.exchange import JaxExchange
from dualtrain_jax.distributed.exit import release
from dualtrain_jax.distributed.learner import DataParallelLearner
from dualtrain_jax.distributed.reduce import local_value, reduce_value
from dualtrain_jax.distributed.rows import AXIS

__all__ = ["JaxRuntime", "join"]

_TARGETS = ("numpy", "torch", "jax")


def join(world: World, /, timeout: float, steps: Steps) -> JaxRuntime:
    """Joins the run `world` describes and returns this process's `JaxRuntime`.

    Several processes: ``jax.distributed.initialize(world.coordinator, world.processes,
    world.rank)`` unless this process already did (a user's or a launcher's call is reused
    when its process count and index agree). Then a mesh over the first
    ``world.local_devices`` devices of every process (0: all of them), in process order, so
    the global batch is the processes' batches concatenated in rank order.

    Args:
        world: this process's place in the run (`dualtrain.multiverse.world.World`).
        timeout: seconds the processes wait for each other to join (> 0).
        steps: its `on_step` is called once per learner step (Multiverse counts steps with
            it), as the step is dispatched: its start, for this process; its `on_begin`
            never: a JAX step is counted at its dispatch, before its collectives run.

    Raises:
        ArgumentError: a bad `world` or `timeout`; more devices asked per process than it
            has (named as `nworld`); a runtime initialized before with another process count
            or index; JAX's backend started before ``jax.distributed.initialize``.
    """
    if not isinstance(world, World):
        raise bad_argument("world", world, "a dualtrain.multiverse.World")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise bad_argument("timeout", timeout, "a positive number of seconds")
    initialized = False
    if world.processes > 1:
        initialized = _initialize(world, timeout)
    mesh = _mesh(world)
    return JaxRuntime(mesh, world, steps.on_step, initialized)


def _initialize(world: World, timeout: float) -> bool:
    """Starts jax.distributed for `world`; False when this process had started it already."""
    if jax.distributed.is_initialized():
        if (jax.process_count(), jax.process_index()) != (world.processes, world.rank):
            raise ArgumentError(
                f"jax.distributed is already initialized as process {jax.process_index()} of "
                f"{jax.process_count()}; this run is process {world.rank} of {world.processes}"
            )
        return False
    try:
        jax.distributed.initialize(
            coordinator_address=world.coordinator,
            num_processes=world.processes,
            process_id=world.rank,
            initialization_timeout=max(1, math.ceil(timeout)),
        )
    except RuntimeError as err:
        if "before any JAX" in str(err) or "must be called before" in str(err):
            raise ArgumentError(
                "a JAX run of several processes must join before this process computes "
                f"anything with JAX (jax.distributed.initialize: {err}); call mv.init() first"
            ) from err
        raise
    return True


def _mesh(world: World) -> Mesh:
    """The one-axis mesh over every process's first ``world.local_devices`` devices."""
    have = jax.local_device_count()
    want = world.local_devices or have
    if want > have:
        platform = jax.local_devices()[0].platform
        hint = (
            "; on the CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX "
            "is imported makes N host devices"
            if platform == "cpu"
            else ""
        )
        raise bad_argument(
            "nworld",
            want * world.processes,
            f"at most {have * world.processes}: {have} {platform} device(s) per process "
            f"here, {world.processes} process(es){hint}",
        )
    by_process: dict[int, list[Any]] = {}
    for device in jax.devices():
        by_process.setdefault(device.process_index, []).append(device)
    devices: list[Any] = []
    for index in sorted(by_process):
        mine = sorted(by_process[index], key=lambda d: d.id)[:want]
        if len(mine) < want:
            raise bad_argument(
                "nworld",
                want * world.processes,
                f"at most {len(mine)} devices on process {index}",
            )
        devices += mine
    return Mesh(np.array(devices), (AXIS,))


class JaxRuntime:
    """One process's handle on a JAX run: its mesh, and what Multiverse does with it.

    Attributes:
        mesh: the one-axis mesh ``("data",)`` over all processes' devices.
        nworld: devices in the mesh (the replicas).
        local_devices: the mesh devices this process drives.
        processes, rank: the processes in the run and this one's index.
        replicated: ``NamedSharding(mesh, P())``, where synced models live.
        batched: ``NamedSharding(mesh, P("data"))``, where batches are split by rows.
    """

    def __init__(
        self, mesh: Mesh, world: World, on_step: Callable[[], None], initialized: bool
    ) -> None:
        self.mesh, self.world, self.on_step = mesh, world, on_step
        self.nworld = int(mesh.size)
        self.local_devices = sum(1 for d in mesh.devices.flat if d.process_index == world.rank)
        self.processes, self.rank = world.processes, world.rank
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.batched = NamedSharding(mesh, PartitionSpec(AXIS))
        self._initialized = initialized  # this runtime started jax.distributed
        self._barriers = itertools.count()
        self.left = False

    def __repr__(self) -> str:
        return (
            f"JaxRuntime(nworld={self.nworld}, processes={self.processes}, rank={self.rank}, "
            f"local_devices={self.local_devices})"
        )

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """A context under ``jax.set_mesh(mesh)`` (entered on ``with``; yields the mesh).

        Inside, the mesh is the default for ``PartitionSpec`` shardings and shard_map.
        """
        return _scope(self.mesh)

    # ---- models -------------------------------------------------------------------------

    def sync_model(self, model: Any, /, options: dict[str, Any]) -> Any:
        """`model` with process 0's arrays, replicated over the mesh (every device a copy).

        Args:
            model: a realized module (`dualtrain_jax.realize`; its params and state are
                synced, its mode kept) or a pytree of arrays (a params dict, say).
            options: none under JAX (a non-empty dict is an ArgumentError naming the key).

        Returns:
            A new module or pytree of the same structure, each array a global array with
            sharding ``NamedSharding(mesh, P())``; `model` itself is unchanged.

        Raises:
            ArgumentError: an option, an unrealized Craft, a leaf that is not an array.
        """
        if options:
            name = sorted(options)[0]
            raise bad_argument(name, options[name], "no keyword: JAX's sync takes no options")
        if isinstance(model, Craft):
            raise bad_argument(
                "model", model, "a realized module: dualtrain_jax.realize(craft, seed=...) first"
            )
        leaves, treedef = jax.tree.flatten(model)
        for path, leaf in jax.tree_util.tree_flatten_with_path(model)[0]:
            if not isinstance(leaf, (np.ndarray, jax.Array, np.generic, int, float)):
                raise bad_argument(
                    "model",
                    model,
                    "a realized module or a pytree of arrays; the leaf at "
                    f"{jax.tree_util.keystr(path)} is a {type(leaf).__name__}",
                )
        return jax.tree.unflatten(treedef, self.replicate(leaves))

    def replicate(self, tree: Any, *, broadcast: bool = True) -> Any:
        """`tree` replicated over the mesh: process 0's arrays.

        Without `broadcast`, each process's own arrays (which must be equal everywhere).
        """
        if self.processes > 1:
            # Host copies first: a global array spanning other processes cannot be broadcast.
            tree = jax.tree.map(local_value, tree)
            if broadcast:
                tree = multihost_utils.broadcast_one_to_all(tree)
            return jax.tree.map(self._global_replicated, tree)
        return jax.device_put(tree, self.replicated)

    def _global_replicated(self, x: Any) -> jax.Array:
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, self.replicated, lambda index: x[index])

    def unwrap(self, model: Any, /) -> Any:
        """`model` itself: JAX wraps nothing (its arrays are already the model's)."""
        return model

    def no_sync(self, model: Any, /) -> contextlib.AbstractContextManager[Any]:
        """A null context: a JAX step reduces gradients inside it (accumulate in the step)."""
        return contextlib.nullcontext(model)

    def learner(
        self,
        model: Any,
        /,
        optimizer: Any,
        loss_fn: Callable[..., Any] | None,
        engine: str,
    ) -> DataParallelLearner:
        """A `DataParallelLearner` of `model` over the mesh (see its docstring)."""
        return DataParallelLearner(self, model, optimizer, loss_fn, engine)

    # ---- data ---------------------------------------------------------------------------

    def batch_device(self, to: str, /) -> Any:
        """Where a Tank serving `to` delivers: ``NamedSharding(mesh, P("data"))`` for "jax".

        Each process's batch is its rows of one global batch (``jax.Array`` over the mesh);
        "numpy" and "torch" batches stay on the host (None).
        """
        if to not in _TARGETS:
            raise bad_argument("to", to, "one of 'numpy', 'torch', 'jax'")
        return self.batched if to == "jax" else None

    # ---- collectives ----------------------------------------------------------------------

    def reduce(self, value: Any, /, aggregate: bool) -> Any:
        """Each process's `value` averaged (summed when `aggregate`) over the processes.

        Args:
            value: a scalar (Python, NumPy, 0-d JAX), an array, or a tuple, list or dict of
                them; the same structure and shapes on every process.
            aggregate: sum instead of mean.

        Returns:
            The same structure, each leaf of its kind: a Python number (a float for a mean),
            a NumPy scalar or array, a JAX array. One process: `value` itself.
        """
        return reduce_value(self, value, aggregate)

    def gather_object(self, obj: Any, /) -> list[Any]:
        """Every process's `obj` (picklable), in rank order (``process_allgather`` of bytes)."""
        if self.processes == 1:
            return [obj]
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32)))
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[: data.size] = data
        every = np.asarray(multihost_utils.process_allgather(padded))
        return [pickle.loads(every[r, : int(sizes[r, 0])].tobytes()) for r in range(len(every))]

    def row_exchange(self) -> JaxExchange:
        """An all-to-all of host rows over one device a process, for a sharded store."""
        return JaxExchange()

    def barrier(self) -> None:
        """Waits until every process reaches it (``sync_global_devices``)."""
        if self.processes > 1:
            multihost_utils.sync_global_devices(f"dualtrain-barrier-{next(self._barriers)}")

    def seed(self, seed: int, /) -> jax.Array:
        """``jax.random.key(seed)`` (JAX has no global RNG to seed)."""
        return jax.random.key(seed)

    def leave(self) -> None:
        """Leaves the run once this process's dispatched work is done (`exit.release`).

        JAX's runtime stays for the process (its exit shuts it down): ``jax.distributed``
        cannot start again in a process whose backend runs, so a later `join` of the same
        run reuses it. Under several processes it returns once every process has left too:
        process 0 holds the run's coordination service, and a process still running when
        that ends is aborted by its client.
        """
        release()
        if self.processes > 1 and not self.left:
            multihost_utils.sync_global_devices("dualtrain-leave")
        self.left = True


@contextlib.contextmanager
def _scope(mesh: Mesh) -> Iterator[Mesh]:
    # jax.set_mesh sets the mesh when called: calling it only on entry keeps scope() inert.
    with jax.set_mesh(mesh):
        yield mesh
