"""What the members' traced step shows, and the isolation probe under JAX.

`inspect` traces (never compiles) one member's forward and backward, and the vmapped
members': which primitives run (only JAX's own cannot mix members), and which convs vmap
turns into grouped convs (slow on XLA:CPU). `probe` runs the members when a primitive
could mix them. Split from `batching.run` (the strategies); the neutral verdict is in
`dualtrain.batching.isolation`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_core

from dualtrain.batching import isolation
from dualtrain_jax.batching.run import (
    Run,
    abstract_members,
    is_array,
    is_mapped,
    member_row,
    members_loss,
)

__all__ = ["Findings", "inspect", "probe"]

# Public JAX primitives that can carry values from one member to another: mutable refs,
# collectives over a named axis, and the stateful RNG and tokens.
_SHARED_STATE = frozenset(
    {
        "get",
        "swap",
        "psum",
        "pmax",
        "pmin",
        "ppermute",
        "all_gather",
        "all_to_all",
        "ragged_all_to_all",
        "axis_index",
        "rng_uniform",
        "create_token",
        "after_all",
    }
)
# JAX's own primitives that are not in `jax.extend.core.primitives` (and keep members apart).
# A debug callback returns nothing, so it cannot carry a value into a member's outputs.
_MORE_PURE = frozenset(
    {
        "stack",
        "unstack",
        "split",
        "pjit",
        "random_wrap",
        "random_unwrap",
        "optimization_barrier",
        "custom_vjp_call_jaxpr",
        "mesh_cast",
        "reshard",
        "debug_callback",
        "square",
    }
)


@functools.cache
def _pure() -> frozenset[str]:
    """Names of the primitives that keep members apart: JAX's own, run per member."""
    from jax.extend.core import primitives

    names = {
        getattr(primitives, n).name
        for n in dir(primitives)
        if isinstance(getattr(primitives, n), jax_core.Primitive)
    }
    return frozenset(names - _SHARED_STATE) | _MORE_PURE


@dataclasses.dataclass(frozen=True)
class Findings:
    """What tracing the members' forward and backward showed (nothing was compiled).

    Attributes:
        foreign: primitives that are not JAX's own pure ones (host callbacks, FFI calls,
            custom batching rules, collectives): only these can mix members, so only with
            them is the isolation probe run.
        regrouped: convs that vmap made grouped (``feature_group_count`` or
            ``batch_group_count`` above one member's own), forward and backward.
        group: the largest such group count (0 if none).
        vmap_error: why the members could not be traced under vmap, or None.
        seconds: the time the traces took.
    """

    foreign: tuple[str, ...]
    regrouped: int = 0
    group: int = 0
    vmap_error: str | None = None
    seconds: float = 0.0


def _equations(jaxpr: Any) -> Iterator[Any]:
    """Every equation of `jaxpr` and of the jaxprs inside it (jit, scan, cond, custom rules)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax_core.ClosedJaxpr):
                    yield from _equations(sub.jaxpr)
                elif isinstance(sub, jax_core.Jaxpr):
                    yield from _equations(sub)


def _traced(run: Run, members: int) -> list[Any]:
    """The equations of `members` members' forward and parameter gradient, traced."""
    args = abstract_members(run, members)
    closed = jax.make_jaxpr(jax.grad(members_loss(run), allow_int=True))(*args)
    return list(_equations(closed.jaxpr))


def _groups(eqns: list[Any]) -> list[int]:
    return [
        max(int(e.params["feature_group_count"]), int(e.params["batch_group_count"]))
        for e in eqns
        if e.primitive.name == "conv_general_dilated"
    ]


def inspect(run: Run, *, vmapped: bool = True) -> Findings:
    """Traces one of `run`'s members' step (and, with `vmapped`, every member's under vmap).

    Tens of milliseconds for small models; no XLA compile. Errors of the member's own
    trace propagate (the first call would raise them too); a vmap trace that fails is
    recorded in `vmap_error`. `run`'s strategy and chunk are not read.
    """
    start = time.perf_counter()
    run = dataclasses.replace(run, strategy="loop", chunk=None)
    alone = _traced(run, 1)
    pure = _pure()
    foreign = tuple(sorted({e.primitive.name for e in alone} - pure))
    if not vmapped:
        return Findings(foreign, seconds=time.perf_counter() - start)
    batch = jax.tree_util.tree_leaves(run.params)[0].shape[0]
    try:
        together = _traced(dataclasses.replace(run, strategy="vmap"), batch)
    except Exception as error:
        text = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        return Findings(foreign, vmap_error=text, seconds=time.perf_counter() - start)
    own = sorted(g for g in _groups(alone) if g > 1)
    grouped = sorted(g for g in _groups(together) if g > 1)
    regrouped = max(len(grouped) - len(own), 0)
    return Findings(
        foreign,
        regrouped,
        max(grouped) if regrouped else 0,
        seconds=time.perf_counter() - start,
    )


def probe(run: Run, *, culprit: str) -> str:
    """Checks on members 0 and 1 that neither moves the other, forward and backward.

    Raises:
        IsolationError: naming the strategy, what moved, and `culprit` (what runs the
            members: JAX code is pure, so only host callbacks or closures over mutable
            Python state can mix them).
    """
    strategy, shared = run.strategy, run.shared
    batch = jax.tree_util.tree_leaves(run.params)[0].shape[0]
    if batch < 2:
        return "skipped (one member)"
    p0, s0 = member_row(run.params, slice(0, 2)), member_row(run.state, slice(0, 2))
    x0 = [member_row(x, slice(0, 2)) if is_mapped(x, shared) else x for x in run.inputs]
    k0 = None if run.keys is None else run.keys[:2]
    if strategy == "map":
        run = dataclasses.replace(run, chunk=1)
    call = _prober(run, x0)
    base = call(p0, s0, x0, k0)
    rng = np.random.default_rng(7)
    for member in (0, 1):
        p1 = jax.tree_util.tree_map(lambda a, m=member: _nudge(a, m, 0.05, rng), p0)
        x1 = [
            jax.tree_util.tree_map(lambda a, m=member: _nudge(a, m, 0.5, rng), x)
            if is_mapped(x, shared)
            else x
            for x in x0
        ]
        changed = call(p1, s0, x1, k0)
        found = isolation.leaks(base, changed, member)
        if found:
            raise isolation.isolation_error(strategy, member, found, culprit)
    return f"passed ({strategy}; members 0 and 1, forward and backward)"


def _nudge(a: Any, member: int, scale: float, rng: np.random.Generator) -> Any:
    if not is_array(a) or not jnp.issubdtype(a.dtype, jnp.floating):
        return a
    noise = rng.standard_normal(a[member].shape) * scale
    return jnp.asarray(a).at[member].add(jnp.asarray(noise, dtype=a.dtype))


def _prober(run: Run, x: Sequence[Any]) -> Callable[..., dict[str, np.ndarray]]:
    """The probe's run: outputs, gradients and new state as NumPy.

    Compiled once for the probe's three calls (same shapes); op by op, each call would
    compile every op again.
    """
    floats = [
        i
        for i, t in enumerate(x)
        if not run.shared and is_array(t) and jnp.issubdtype(t.dtype, jnp.floating)
    ]

    @jax.jit
    def forward_backward(p: Any, s: Any, xs: list[Any], keys: Any) -> tuple[Any, Any, Any]:
        def f(p: Any, *diff: Any) -> tuple[Any, Any]:
            full = list(xs)
            for i, t in zip(floats, diff, strict=True):
                full[i] = t
            return run.on(p, s, full, keys)

        (out, new_state), pullback = jax.vjp(f, p, *[xs[i] for i in floats])
        # A fixed, uneven cotangent: a plain sum would hide a leak that cancels out.
        return out, new_state, pullback(jax.tree_util.tree_map(_weights, (out, new_state)))

    def call(p: Any, s: Any, xs: Sequence[Any], keys: Any) -> dict[str, np.ndarray]:
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

    return call


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
