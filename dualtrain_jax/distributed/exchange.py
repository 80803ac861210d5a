"""The all-to-all a sharded EmbeddingStore's batches travel by, on JAX's multi-process runtime.

One device of each process forms a one-axis mesh, and ``jax.lax.all_to_all`` inside
``shard_map`` moves the rows (on the CPU, over the gloo collectives ``jax.distributed``
starts). Shapes under ``jit`` are static, so every process's lengths are shared first
(``process_allgather``, once a batch) and every part is padded to one capacity, a power of
two (at least 16 rows): one program is compiled per (capacity, bytes a row), so a run recompiles
only when its largest part crosses a power of two, and ids, rows and gradients of any dtype
share programs by their width in bytes.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dualtrain.embeddings.sharding import Counts, Exchange, Wire

__all__ = ["JaxExchange", "capacity"]

_AXIS = "processes"


def capacity(rows: int) -> int:
    """The padded length of a part of `rows` rows: a power of two, at least 16."""
    return max(16, 1 << max(rows - 1, 0).bit_length())


class JaxExchange:
    """``jax.lax.all_to_all`` over one device a process (`dualtrain.embeddings.Exchange`).

    Each call is one collective, the padded rows, when the caller passes the lengths (from
    `lengths`, an all-gather, once a batch), else two. Every process must call it in the
    same order.

    Attributes:
        rank: this process's index.
        world: processes in the run.
        mesh: the one-axis mesh of each process's first device.
        programs: the (capacity, bytes a row) pairs compiled so far.
        ahead: None: JAX's multi-process collectives must come from one thread in the same
            order on every process, so a prefetch routes on this exchange, at its call.
    """

    def __init__(self) -> None:
        self.ahead: Exchange | None = None
        self.rank, self.world = jax.process_index(), jax.process_count()
        firsts = [
            min(jax.local_devices(process_index=p), key=lambda d: d.id) for p in range(self.world)
        ]
        self.mesh = Mesh(np.array(firsts), (_AXIS,))
        self.programs: set[tuple[int, int]] = set()

    def lengths(self, sent: list[int], /) -> np.ndarray:
        """Every process's part lengths, int64 [world, world] (``process_allgather``)."""
        mine = np.array(sent, np.int64)
        return np.asarray(multihost_utils.process_allgather(mine)).reshape(self.world, -1)

    def all_to_all(
        self, parts: list[np.ndarray], /, counts: Counts | None = None
    ) -> list[np.ndarray]:
        """Sends ``parts[j]`` to rank j; returns what each rank sent here, by rank.

        The padded capacity must be the same on every process: without `counts` (from
        `lengths`) the lengths are shared first, one more collective.
        """
        wire = Wire.of(parts)
        if counts is None:
            counts = Counts.of(self.lengths([len(p) for p in parts]), self.rank)
        cap = capacity(counts.most)
        local = np.zeros((self.world, cap, wire.width), np.uint8)
        for j, part in enumerate(parts):
            local[j, : len(part)] = wire.pack(part)
        sharding = NamedSharding(self.mesh, P(_AXIS))
        shape = (self.world * self.world, cap, wire.width)
        sent = jax.make_array_from_process_local_data(sharding, local, shape)
        self.programs.add((cap, wire.width))
        moved = _program(self.mesh)(sent)
        mine = np.asarray(moved.addressable_shards[0].data)
        return [wire.unpack(mine[j, : counts.receive[j]]) for j in range(self.world)]


@functools.lru_cache(maxsize=8)
def _program(mesh: Mesh) -> Any:
    def swap(block: jax.Array) -> jax.Array:
        return jax.lax.all_to_all(block, _AXIS, 0, 0, tiled=True)

    spec = P(_AXIS)
    return jax.jit(jax.shard_map(swap, mesh=mesh, in_specs=spec, out_specs=spec))
