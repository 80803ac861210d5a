"""The isolation probe under JAX: does perturbing one member move another?

Split from `batching_run` (the strategies); the neutral verdict is in
`dualtrain.batching.isolation`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dualtrain.batching import isolation
from dualtrain_jax.batching_run import (
    Member,
    _is_array,
    _row,
    is_mapped,
    run_members,
)

__all__ = ["probe"]


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
