"""Training an EmbeddingStore's rows with any row-wise optax transformation.

Per step the batch's unique rows and their state rows are staged (padded to a power of two,
so jit sees few shapes), one jitted function sums the gradients of repeated ids
(`segment_sum`), applies ``tx.update`` and returns the new rows and state, its inputs
donated, and the rows go back to the host table.

Which transformations qualify, and the state rows they keep, is `embeddings_optimizers`'s.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualtrain.embeddings import (
    Attachment,
    EmbeddingStore,
    RowSession,
    ShardedAttachment,
)
from dualtrain.errors import ArgumentError, DtypeError, ShapeError, bad_argument
from dualtrain_jax.embeddings_optimizers import plan
from dualtrain_jax.transfer import Transfer

__all__ = ["JaxRows", "ShardedJaxRows", "attach"]


def attach(
    store: EmbeddingStore,
    transformation: optax.GradientTransformation,
    mode: str = "lazy",
    device: Any = None,
) -> JaxRows | ShardedJaxRows:
    """Trains `store` with an optax transformation, one batch of rows at a time.

    Args:
        store: the rows and (after this call) their optimizer-state tables.
        transformation: e.g. ``optax.adam(1e-3)``; must be row-wise (see the module doc).
        mode: "lazy" or "exact", as for ``dualtrain_torch.attach``.
        device: where rows are updated ("cpu", "gpu", "cuda:N", a jax.Device); default
            this process's first device.

    Returns:
        A `JaxRows`: ``emb = rows.fetch(ids)``; ``g = jax.grad(loss)(emb)``; ``rows.step(g)``.
        For a store sharded by ``mv.sync(store)``, a `ShardedJaxRows` with the same calls:
        each row's gradient is summed over the processes and stepped once by its owner.
    """
    rows = JaxRows(store, transformation, mode, device)
    return rows if store.shard is None else ShardedJaxRows(rows, store.shard)


def check_grads(grads: tuple[Any, ...], shapes: list[tuple[int, ...]]) -> None:
    """Refuses gradients that are not one array per fetched array, in its shape."""
    if len(grads) != len(shapes):
        raise ArgumentError(f"step got {len(grads)} gradient arrays; fetch returned {len(shapes)}")
    for i, (g, shape) in enumerate(zip(grads, shapes, strict=True)):
        if tuple(np.shape(g)) != shape:
            raise ShapeError(f"grads[{i}] has shape {tuple(np.shape(g))}; expected {shape}")


@functools.partial(jax.jit, static_argnums=2)
def _add_rows(values: jax.Array, index: jax.Array, count: int) -> jax.Array:
    """Rows of `values` [N, dim] added up by `index` [N] into [count, dim] (float32 at least)."""
    wide = values.astype(jnp.promote_types(values.dtype, jnp.float32))
    return jax.ops.segment_sum(wide, index, num_segments=count)


def _padded(union: np.ndarray) -> np.ndarray:
    """`union` padded with its first id to `_pad` ids (its padding rows get no gradient)."""
    if not union.size:
        return union
    return np.concatenate([union, np.full(_pad(union.size) - union.size, union[0])])


def _pad(n: int) -> int:
    return max(16, 1 << max(n - 1, 0).bit_length())


class JaxRows(Attachment):
    """A store attached to an optax transformation (see `attach`).

    Attributes:
        store: the EmbeddingStore.
        transformation: the optax transformation.
        mode: "lazy" or "exact".
        slots: the state tables' names (optax's mu, nu, trace, sum_of_squares under torch's
            names exp_avg, exp_avg_sq, momentum_buffer, sum).
        transfer: the `dualtrain_jax.transfer.Transfer` that takes rows to `device`.
    """

    def __init__(self, store: EmbeddingStore, transformation: Any, mode: str, device: Any) -> None:
        if not isinstance(store, EmbeddingStore):
            raise bad_argument("store", type(store).__name__, "a dualtrain.EmbeddingStore")
        if not (hasattr(transformation, "init") and hasattr(transformation, "update")):
            raise bad_argument(
                "transformation", type(transformation).__name__, "an optax GradientTransformation"
            )
        if store.dtype == "float64" and not jax.config.read("jax_enable_x64"):
            raise DtypeError(
                "a float64 EmbeddingStore needs jax_enable_x64 (JAX would compute in float32); "
                "enable it or make the store float32"
            )
        self.transformation = transformation
        # Rows reach the device through the adapter's one Transfer (a bad device fails here).
        self.transfer = Transfer(device if device is not None else jax.local_devices()[0])
        self.device = self.transfer.device
        self.dim = store.dim
        self.plan = plan(transformation, store.dim, store.dtype)
        self.slots = self.plan.slots
        self.session = RowSession(store, self.plan.init, mode, pad=_pad)
        self.store, self.mode = store, mode
        self._dev: dict[str, jax.Array] = {}

    # ---- the step ----------------------------------------------------------------------

    def fetch(self, *ids: Any) -> jax.Array | tuple[jax.Array, ...]:
        """The rows of `ids` as device arrays [*ids.shape, dim] (one per id array given)."""
        batch = self.session.begin(ids)
        # Staging is 64-byte aligned, so on the CPU this hand-over is zero-copy.
        self._dev = self.transfer(batch.rows)
        # Exact mode: rows take the steps they missed before the forward pass sees them.
        w, slots = self._catch_up(batch, self._dev["weight"], [self._dev[k] for k in self.slots])
        self._dev = {"weight": w, **dict(zip(self.slots, slots, strict=False))}
        self._inverse = self.transfer(batch.lookup.inverse.astype(np.int32))
        out, start = [], 0
        for shape in batch.lookup.shapes:
            count = int(np.prod(shape, dtype=np.int64))
            part = self._inverse[start : start + count].reshape(shape)
            out.append(self.plan.take(self._dev["weight"], part))
            start += count
        return out[0] if len(out) == 1 else tuple(out)

    def step(self, *grads: Any) -> None:
        """Updates the fetched rows and their state, and writes both back.

        `grads` are the gradients of what `fetch` returned, in the same shapes (repeated
        ids add up). Nothing is written back when this raises; fetch again to retry.
        """
        batch = self.session.require_current()
        try:
            check_grads(grads, [(*s, self.dim) for s in batch.lookup.shapes])
            w = self._dev["weight"]
            slots = tuple(self._dev[k] for k in self.slots)
            w, slots = self.plan.update(w, slots, self.session.t, tuple(grads), self._inverse)
        except BaseException:
            self.session.abandon()
            raise
        self._dev = {}
        self.session.finish(batch, {"weight": w, **dict(zip(self.slots, slots, strict=False))})

    def settle(self) -> None:
        """Exact mode: brings every row up to the current step.

        Each row replays the steps it missed, so the table equals dense training's now; a
        no-op in lazy mode.
        """
        with self.session.owned():  # one unit: no thread steps in between
            if self.plan.idle_identity:
                return
            for ids in self.session.stale(self.plan.fresh_identity):
                self.fetch(ids)  # catches the rows up
                batch = self.session.require_current()
                self.session.finish(batch, self._dev, advance=False)
                self._dev = {}

    def _catch_up(self, batch: Any, w: Any, slots: Any) -> tuple[Any, Any]:
        slots = tuple(slots)
        if self.plan.idle_identity:
            return w, slots
        taus, last = self.session.missed(batch, self.plan.fresh_identity)
        if not taus:
            return w, slots
        padded = np.full(w.shape[0], np.iinfo(np.int64).max, np.int64)
        padded[: last.size] = last
        for tau in taus:
            w, slots = self.plan.replay(w, slots, tau - 1, self.transfer(padded < tau))
        return w, slots

    @property
    def hyper(self) -> dict[str, Any]:
        """What is known of the transformation's settings (optax keeps them in closures)."""
        return {"transformation": repr(self.transformation)}


class ShardedJaxRows(ShardedAttachment):
    """A shard attached to an optax transformation (see `attach` and `ShardedAttachment`).

    ``fetch`` takes ids of the whole table and returns their rows from their owners;
    ``step(*grads)`` has each owner step its rows once with the sum of every process's
    gradient. ``fetch``, ``prefetch`` and ``step`` are collectives. The exchange pads to
    powers of two (``dualtrain_jax.distributed.exchange``); `fetch` returns arrays of the
    ids' own shapes, so a model's jit sees what it would see unsharded.

    Attributes:
        local: the `JaxRows` training this process's rows.
    """

    def __init__(self, local: JaxRows, shard: Any) -> None:
        super().__init__(local, shard)
        self._shapes: list[tuple[int, ...]] = []
        self._inverse = np.zeros(0, np.int64)
        self._served = 0  # this shard's rows fetched for the open batch

    def fetch(self, *ids: Any) -> jax.Array | tuple[jax.Array, ...]:
        """The rows of `ids` (ids of the whole table) as device arrays [*ids.shape, dim]."""
        found, rows = self.exchange_rows(ids)
        self._shapes = [(*shape, self.store.dim) for shape in found.shapes]
        self._inverse = found.inverse
        out = [self.local.transfer(rows[part]) for part in found.parts]
        return out[0] if len(out) == 1 else tuple(out)

    def fetch_local(self, union: np.ndarray) -> np.ndarray:
        # The union's length changes every step; padded (with its first id, whose padding
        # rows get a zero gradient) to the local attachment's own sizes, so its jitted
        # update sees as few shapes as an unsharded store's.
        self._served = union.size
        return np.asarray(self.local.fetch(_padded(union)))[: union.size]

    def prefetch_local(self, union: np.ndarray) -> None:
        self.local.prefetch(_padded(union))  # as fetch_local will ask for them

    def step(self, *grads: Any) -> None:
        """Steps every fetched row once, with its gradient summed over the processes.

        `grads` are the gradients of what `fetch` returned, in the same shapes.
        """
        route = self.require_route()  # this thread's batch, before any exchange
        shapes = self._shapes
        try:
            check_grads(grads, shapes)
            unique = route.lookup.unique.size
            joined = jnp.concatenate([jnp.reshape(g, (-1, self.store.dim)) for g in grads])
            inverse = self.local.transfer(self._inverse.astype(np.int32))
            # Repeated ids add up, on the device (np.add.at took 5 ms a batch of 8,192 x 64):
            # to a power-of-two count of rows, so the sum compiles for few shapes.
            summed = np.asarray(_add_rows(joined, inverse, _pad(unique)))[:unique]
        except BaseException:
            self.release()
            raise
        self.step_rows(summed)

    def step_local(self, summed: np.ndarray) -> None:
        served = self._served
        padded = np.zeros((_pad(served) if served else 0, self.store.dim), summed.dtype)
        padded[:served] = summed
        self.local.step(padded)
