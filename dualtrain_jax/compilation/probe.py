"""What a JAX trial computes and how calls are told apart: signatures, host copies, projections.

A call's arguments are split once per input signature (`Layout`): array leaves and Python
numbers are traced, as ``jax.jit`` traces them; any other leaf (a string, an enum, an
object) is held fixed and is part of the signature by value. What a trial hands the ladder
are host copies (`host`); a module trial in training also projects the outputs on fixed
random weights (`projection`) to compare gradients. JAX arrays are immutable, so a trial
needs no snapshot: the only thing it could destroy, a donated buffer, is always a copy
(`copy_tree`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dualtrain_jax.compilation.keys import NUMBERS, eps

__all__ = ["copy_tree", "elements", "host", "projection", "shapes"]


def copy_tree(tree: Any) -> Any:
    """`tree` with every JAX array copied into a new buffer (donating it spares the original)."""
    return jax.tree_util.tree_map(lambda a: a.copy() if isinstance(a, jax.Array) else a, tree)


def _to_numpy(leaf: Any, floor: str | None) -> np.ndarray:
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    elif type(leaf) in NUMBERS:
        leaf = jnp.asarray(leaf)  # eager may return 2.0 where jit returns a float32 array
    dtype = getattr(leaf, "dtype", None)
    if (
        floor is not None
        and dtype is not None
        and jnp.issubdtype(dtype, jnp.floating)
        and eps(dtype) < eps(floor)
    ):
        leaf = jnp.asarray(leaf).astype(floor)  # compared at the inputs' precision
    # A copy, never a view: a later donation may reuse the buffer under a view.
    return np.array(leaf, copy=True)


def host(tree: Any, prefix: str, floor: str | None = None) -> tuple[list[str], list[np.ndarray]]:
    """Names (``prefix`` + the leaf's path) and host copies of the leaves of `tree`.

    Floating leaves more precise than `floor` (a dtype name, `Layout.floor`) are rounded to
    it, so their comparison uses the tolerance of the precision they were computed at.
    """
    pairs = jax.tree_util.tree_flatten_with_path(tree)[0]
    names = [prefix + jax.tree_util.keystr(path) for path, _ in pairs]
    return names, [_to_numpy(leaf, floor) for _, leaf in pairs]


def elements(out: Any) -> tuple[Any, ...]:
    """What a step "returns anew": the top-level elements of a tuple or list, else the value."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def shapes(tree: Any) -> tuple[Any, tuple[tuple[tuple[int, ...], str], ...]]:
    """The tree's structure and each leaf's (shape, dtype): what donation matches on."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


PROJECTION_SEED = 20170614  # fixed: every rung projects the outputs on the same vector


def projection(out: Any) -> list[np.ndarray | None]:
    """Fixed random weights per floating output leaf (None elsewhere), the same every rung."""
    key = jax.random.key(PROJECTION_SEED)
    proj: list[np.ndarray | None] = []
    for i, leaf in enumerate(jax.tree_util.tree_leaves(out)):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            proj.append(None)
            continue
        r = jax.random.normal(jax.random.fold_in(key, i), jnp.shape(leaf), jnp.float32)
        proj.append(np.asarray(r).astype(dtype))
    return proj


# -- what a decision depends on, for the decision cache ----------------------------------
