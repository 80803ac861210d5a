"""How a JAX BatchModule runs its members: the strategies, their timing, the probe.

Every strategy calls one member function ``one(params, state, key, train, *inputs) ->
(outputs, new_state)`` on member i's slice of the stacked arrays: "vmap" maps it over all
members, "map" runs it member by member (or chunk by chunk under a memory budget) inside
one ``lax.map``, "loop" calls a jitted member function once per member.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["is_mapped", "is_traced", "member_bytes", "run_members", "timed_runs"]

Member = Callable[..., tuple[Any, Any]]


def is_traced(*trees: Any) -> bool:
    """Whether any leaf is a tracer (inside jit, grad or vmap): then nothing can be timed."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(trees))


def _row(tree: Any, index: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: a[index], tree)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def is_mapped(x: Any, shared: bool) -> bool:
    """Whether input `x` is split per member: an array, or a tuple, list or dict of arrays.

    Anything else (a Python number, a flag, a container holding one) reaches every member
    whole, as do all inputs with `shared`.
    """
    leaves = jax.tree_util.tree_leaves(x)
    return not shared and bool(leaves) and all(_is_array(leaf) for leaf in leaves)


@functools.lru_cache(maxsize=256)
def _jitted(one: Member, train: bool) -> Callable[..., tuple[Any, Any]]:
    return jax.jit(lambda p, s, k, *x: one(p, s, k, train, *x))


def run_members(
    one: Member,
    strategy: str,
    chunk: int | None,
    params: Any,
    state: Any,
    inputs: Sequence[Any],
    shared: bool,
    keys: Any,
    train: bool,
) -> tuple[Any, Any]:
    """``(outputs, new_state)``, each leaf ``[batch, ...]``, under `strategy`."""
    batch = jax.tree_util.tree_leaves(params)[0].shape[0]
    mapped = [is_mapped(x, shared) for x in inputs]
    if strategy == "loop":
        f = _jitted(one, train)
        results = [
            f(
                _row(params, i),
                _row(state, i),
                None if keys is None else keys[i],
                *(_row(x, i) if m else x for x, m in zip(inputs, mapped, strict=True)),
            )
            for i in range(batch)
        ]
        return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *results)

    def call(p: Any, s: Any, k: Any, xs: Sequence[Any]) -> tuple[Any, Any]:
        it = iter(xs)
        full = [next(it) if m else x for x, m in zip(inputs, mapped, strict=True)]
        return one(p, s, k, train, *full)

    batched = [x for x, m in zip(inputs, mapped, strict=True) if m]
    if strategy == "vmap":
        kdim = None if keys is None else 0
        return jax.vmap(call, in_axes=(0, 0, kdim, 0))(params, state, keys, batched)
    return jax.lax.map(lambda a: call(*a), (params, state, keys, batched), batch_size=chunk)


def _total(out: Any) -> Any:
    leaves = [
        jnp.sum(leaf)
        for leaf in jax.tree_util.tree_leaves(out)
        if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating)
    ]
    return sum(leaves) if leaves else jnp.zeros(())


def timed_runs(
    one: Member,
    options: dict[str, int | None],
    params: Any,
    state: Any,
    inputs: Sequence[Any],
    shared: bool,
    keys: Any,
    train: bool,
    members: int | None = None,
) -> dict[str, Callable[[], None]]:
    """One callable per candidate: the jitted forward and backward.

    As a training step runs it; the untimed first call compiles. `members` runs only the
    first that many.
    """
    if members is not None:
        params, state = _row(params, slice(0, members)), _row(state, slice(0, members))
        keys = None if keys is None else keys[:members]
        if not shared:
            inputs = [_row(x, slice(0, members)) if is_mapped(x, shared) else x for x in inputs]

    def make(strategy: str, chunk: int | None) -> Callable[[], None]:
        def loss(p: Any) -> Any:
            out, _ = run_members(one, strategy, chunk, p, state, inputs, shared, keys, train)
            return _total(out)

        # allow_int: a pair's params may hold integer leaves (they get float0 gradients).
        fn = jax.jit(jax.grad(loss, allow_int=True))
        return lambda: jax.block_until_ready(fn(params))

    return {name: make(name, chunk) for name, chunk in options.items()}


def member_bytes(
    one: Member,
    params: Any,
    state: Any,
    inputs: Sequence[Any],
    shared: bool,
    keys: Any,
    train: bool,
) -> int:
    """Estimated bytes of one member's forward and backward.

    From XLA's memory analysis of the compiled step (arguments, outputs, temporaries); a
    coarser sum where XLA has none.
    """
    # Abstract shapes of one member: works on concrete arrays and under a trace alike.
    one_row = lambda a: jax.ShapeDtypeStruct((1, *a.shape[1:]), a.dtype)  # noqa: E731
    p1 = jax.tree_util.tree_map(one_row, params)
    s1 = jax.tree_util.tree_map(one_row, state)
    k1 = None if keys is None else one_row(keys)
    mapped = [is_mapped(x, shared) for x in inputs]
    x1 = [
        jax.tree_util.tree_map(one_row, x) if m else x for x, m in zip(inputs, mapped, strict=True)
    ]
    batched = [x for x, m in zip(x1, mapped, strict=True) if m]

    def loss(p: Any, s: Any, k: Any, xs: list[Any]) -> Any:
        it = iter(xs)
        full = [next(it) if m else x for x, m in zip(x1, mapped, strict=True)]
        out, _ = run_members(one, "vmap", None, p, s, full, shared, k, train)
        return _total(out)

    size = lambda tree: sum(  # noqa: E731
        int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree_util.tree_leaves(tree)
    )
    try:
        compiled = jax.jit(jax.grad(loss, allow_int=True)).lower(p1, s1, k1, batched).compile()
        stats = compiled.memory_analysis()
        if stats is None:
            raise TypeError("no memory analysis")
        return int(
            stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
        )
    except Exception:
        return 3 * size(p1) + size(s1) + size(batched)
