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

from dualtrain.batching import isolation

__all__ = ["is_mapped", "is_traced", "member_bytes", "probe", "run_members", "timed_runs"]

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


def probe(
    one: Member,
    strategy: str,
    chunk: int | None,
    params: Any,
    state: Any,
    inputs: Sequence[Any],
    shared: bool,
    keys: Any,
    train: bool,
    culprit: str,
) -> str:
    """Checks on members 0 and 1 that neither moves the other, forward and backward.

    Raises:
        IsolationError: naming the strategy, what moved, and `culprit` (what runs the
            members: JAX code is pure, so only host callbacks or closures over mutable
            Python state can mix them).
    """
    batch = jax.tree_util.tree_leaves(params)[0].shape[0]
    if batch < 2:
        return "skipped (one member)"
    p0, s0 = _row(params, slice(0, 2)), _row(state, slice(0, 2))
    x0 = [_row(x, slice(0, 2)) if is_mapped(x, shared) else x for x in inputs]
    k0 = None if keys is None else keys[:2]
    chunk = 1 if strategy == "map" else chunk
    run = _prober(one, strategy, chunk, x0, shared, train)
    base = run(p0, s0, x0, k0)
    rng = np.random.default_rng(7)
    for member in (0, 1):
        p1 = jax.tree_util.tree_map(lambda a, m=member: _nudge(a, m, 0.05, rng), p0)
        x1 = [
            jax.tree_util.tree_map(lambda a, m=member: _nudge(a, m, 0.5, rng), x)
            if is_mapped(x, shared)
            else x
            for x in x0
        ]
        changed = run(p1, s0, x1, k0)
        found = isolation.leaks(base, changed, member)
        if found:
            raise isolation.isolation_error(strategy, member, found, culprit)
    return f"passed ({strategy}; members 0 and 1, forward and backward)"


def _nudge(a: Any, member: int, scale: float, rng: np.random.Generator) -> Any:
    if not _is_array(a) or not jnp.issubdtype(a.dtype, jnp.floating):
        return a
    noise = rng.standard_normal(a[member].shape) * scale
    return jnp.asarray(a).at[member].add(jnp.asarray(noise, dtype=a.dtype))


def _prober(
    one: Member, strategy: str, chunk: int | None, x: Sequence[Any], shared: bool, train: bool
) -> Callable[..., dict[str, np.ndarray]]:
    """The probe's run: outputs, gradients and new state as NumPy.

    Compiled once for the probe's three calls (same shapes); op by op, each call would
    compile every op again.
    """
    floats = [
        i
        for i, t in enumerate(x)
        if not shared and _is_array(t) and jnp.issubdtype(t.dtype, jnp.floating)
    ]

    @jax.jit
    def forward_backward(p: Any, s: Any, xs: list[Any], keys: Any) -> tuple[Any, Any, Any]:
        def f(p: Any, *diff: Any) -> tuple[Any, Any]:
            full = list(xs)
            for i, t in zip(floats, diff, strict=True):
                full[i] = t
            return run_members(one, strategy, chunk, p, s, full, shared, keys, train)

        (out, new_state), pullback = jax.vjp(f, p, *[xs[i] for i in floats])
        # A fixed, uneven cotangent: a plain sum would hide a leak that cancels out.
        return out, new_state, pullback(jax.tree_util.tree_map(_weights, (out, new_state)))

    def run(p: Any, s: Any, xs: Sequence[Any], keys: Any) -> dict[str, np.ndarray]:
        out, new_state, grads = forward_backward(p, s, list(xs), keys)
        found: dict[str, np.ndarray] = {}
        for i, leaf in enumerate(jax.tree_util.tree_leaves(out)):
            found[f"outputs[{i}]"] = np.asarray(leaf, dtype=np.float64)
        for name, g in _named(grads[0]).items():
            if g.dtype != jax.dtypes.float0:  # an integer leaf has no gradient to compare
                found[f"the gradient of {name}"] = np.asarray(g, dtype=np.float64)
        for i, g in zip(floats, grads[1:], strict=True):
            found[f"the gradient of inputs[{i}]"] = np.asarray(g, dtype=np.float64)
        for name, v in _named(new_state).items():
            found[f"the state {name}"] = np.asarray(v, dtype=np.float64)
        return found

    return run


def _named(tree: Any) -> dict[str, Any]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): leaf for path, leaf in flat}


def _weights(t: Any) -> Any:
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.floating):
        return np.zeros(t.shape, jax.dtypes.float0)
    n = int(np.prod(t.shape[1:]))
    w = np.cos(np.arange(n) * 0.7 + 0.3).reshape(t.shape[1:])
    return jnp.broadcast_to(jnp.asarray(w, dtype=t.dtype), t.shape)
