"""Which optax transformations train an EmbeddingStore's rows, and the state they keep per row.

A transformation qualifies when its state is made of leaves shaped like the parameter (row
slots, one host table each) and scalar counters or constants (global), and its update of a
block of rows equals its update of each row alone; `plan` checks both on a probe. The torch
adapter's ``embeddings_optimizers`` is the same catalogue for ``torch.optim`` classes.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualtrain.errors import ArgumentError, bad_argument

__all__ = ["Plan", "plan"]

# optax state fields under the names torch gives the same quantities, so a checkpoint
# written under one framework resumes under the other.
_NEUTRAL = {
    "mu": "exp_avg",
    "nu": "exp_avg_sq",
    "trace": "momentum_buffer",
    "sum_of_squares": "sum",
}


def _slot_name(path: tuple[Any, ...], taken: set[str]) -> str:
    last = path[-1]
    name = _NEUTRAL.get(getattr(last, "name", ""), "")
    if not name or name in taken:
        name = jax.tree_util.keystr(path).strip("[].").replace("][", ".").replace("].", ".")
    return name


def plan(tx: Any, dim: int, dtype: str) -> Plan:
    """The analysis and compiled step of `tx` for rows of `dim`, shared by attachments."""
    try:
        return _cached(tx, dim, dtype)
    except TypeError:  # an unhashable transformation: analyse it afresh
        return Plan(tx, dim, dtype)


class Plan:
    """What a transformation keeps per row and globally, checked, with its jitted step."""

    def __init__(self, tx: Any, dim: int, dtype: str) -> None:
        self.tx, self.dim, self.dtype = tx, dim, jnp.dtype(dtype)
        self.init = self._classify()
        self._check_row_wise()
        self.idle_identity = self._is_identity(fresh=False)
        self.fresh_identity = self._is_identity(fresh=True)
        self.update = jax.jit(self._update_rows, donate_argnums=(0, 1))
        self.replay = jax.jit(self._replay_rows, donate_argnums=(0, 1))
        self.take = jax.jit(lambda w, i: jnp.take(w, i, axis=0))

    def _classify(self) -> dict[str, np.ndarray]:
        """Sorts state leaves into row slots and globals; returns each slot's initial row."""
        one = self.tx.init(jnp.zeros((1, self.dim), self.dtype))
        two = self.tx.init(jnp.zeros((2, self.dim), self.dtype))
        leaves, self._treedef = jax.tree_util.tree_flatten_with_path(one)
        # jaxlib ships PyTreeDef without stubs, so mypy cannot see its comparison
        if jax.tree_util.tree_structure(two) != self._treedef:  # type: ignore[operator]
            raise self._not_row_wise("its state's structure depends on the parameter's size")
        self._kinds: list[str] = []
        self._constants: list[Any] = []
        init: dict[str, np.ndarray] = {}
        taken: set[str] = set()
        for (path, a), b in zip(leaves, jax.tree_util.tree_leaves(two), strict=False):
            a, b = jnp.asarray(a), jnp.asarray(b)
            if a.shape == (1, self.dim) and b.shape == (2, self.dim):
                name = _slot_name(path, taken)
                taken.add(name)
                init[name] = np.asarray(a[0])
                self._kinds.append(name)
            elif a.shape == b.shape and a.shape == ():
                self._kinds.append("count" if jnp.issubdtype(a.dtype, jnp.integer) else "const")
            else:
                raise self._not_row_wise(f"state leaf {jax.tree_util.keystr(path)} is {a.shape}")
            self._constants.append(a)
        self.slots = list(init)
        return init

    def _not_row_wise(self, why: str) -> ArgumentError:
        return bad_argument(
            "transformation", type(self.tx).__name__, f"a row-wise optax transformation ({why})"
        )

    def _state(self, slots: tuple[jax.Array, ...], count: Any) -> Any:
        """The optax state of a block of rows after `count` global steps."""
        leaves, it = [], iter(slots)
        for kind, const in zip(self._kinds, self._constants, strict=False):
            if kind == "count":
                leaves.append(jnp.asarray(count, const.dtype))
            elif kind == "const":
                leaves.append(const)
            else:
                leaves.append(next(it))
        return jax.tree_util.tree_unflatten(self._treedef, leaves)

    def _slots_of(self, state: Any) -> tuple[jax.Array, ...]:
        leaves = jax.tree_util.tree_leaves(state)
        return tuple(
            x for x, k in zip(leaves, self._kinds, strict=False) if k not in ("count", "const")
        )

    def _check_row_wise(self) -> None:
        """Refuses a transformation that is not row-wise.

        A block's update must equal its rows' updates alone, and globals must be counters
        or constants (clip_by_global_norm, for one, fails the first).
        """
        key = jax.random.PRNGKey(0)
        w, g1, g2 = jax.random.normal(key, (3, 3, self.dim), self.dtype)
        init = self.tx.init(w)

        def two_steps(w: Any, g1: Any, g2: Any, state: Any) -> Any:
            for g in (g1, g2):
                updates, state = self.tx.update(g, state, w)
                w = optax.apply_updates(w, updates)
            return w, state

        block, state = two_steps(w, g1, g2, init)
        alone = [
            two_steps(w[i : i + 1], g1[i : i + 1], g2[i : i + 1], self.tx.init(w[i : i + 1]))
            for i in range(3)
        ]
        if not np.allclose(block, jnp.concatenate([a[0] for a in alone]), rtol=1e-5, atol=1e-6):
            raise self._not_row_wise("updating rows together differs from updating each alone")
        for leaf, kind, const in zip(
            jax.tree_util.tree_leaves(state), self._kinds, self._constants, strict=False
        ):
            if kind == "count" and int(leaf) != int(const) + 2:
                raise self._not_row_wise("an integer state leaf that does not count steps")
            if kind == "const" and not np.array_equal(leaf, const):
                raise self._not_row_wise("a scalar state leaf that changes from step to step")

    def _is_identity(self, fresh: bool) -> bool:
        """Whether a zero-gradient step leaves rows and state unchanged.

        From the initial state when `fresh`, else from any state; exact mode then skips
        replaying it.
        """
        key = jax.random.PRNGKey(1)
        w = jax.random.normal(key, (3, self.dim), self.dtype)
        init = self._slots_of(self.tx.init(w))
        slots = (
            init
            if fresh
            else tuple(jnp.abs(jax.random.normal(key, s.shape, s.dtype)) + 0.5 for s in init)
        )
        updates, state = self.tx.update(jnp.zeros_like(w), self._state(slots, 1), w)
        after = (optax.apply_updates(w, updates), *self._slots_of(state))
        return all(np.array_equal(a, b) for a, b in zip((w, *slots), after, strict=False))

    # ---- jitted bodies -----------------------------------------------------------------

    def _update_rows(
        self, w: Any, slots: Any, count: Any, grads: Any, inverse: Any
    ) -> tuple[Any, Any]:
        flat = jnp.concatenate([g.reshape(-1, self.dim) for g in grads]).astype(w.dtype)
        summed = jax.ops.segment_sum(flat, inverse, num_segments=w.shape[0])
        updates, state = self.tx.update(summed, self._state(slots, count), w)
        return optax.apply_updates(w, updates), self._slots_of(state)

    def _replay_rows(self, w: Any, slots: Any, count: Any, active: Any) -> tuple[Any, Any]:
        updates, state = self.tx.update(jnp.zeros_like(w), self._state(slots, count), w)
        keep = active[:, None]
        new_w = jnp.where(keep, optax.apply_updates(w, updates), w)
        new_slots = tuple(
            jnp.where(keep, n, o) for n, o in zip(self._slots_of(state), slots, strict=False)
        )
        return new_w, new_slots


_cached = functools.lru_cache(maxsize=64)(Plan)
