"""Per-member training under JAX: optax SGD, Adam and AdamW with ``[batch]`` hyper-parameters.

`member_optimizer` returns an ``optax.GradientTransformation`` for a `BatchModule`'s stacked
params (every leaf ``[batch, ...]``). Its state is the state ``optax.inject_hyperparams`` of
optax's ``sgd``/``adam``/``adamw`` has, with a leading ``[batch]`` on every leaf, so each
member's hyper-parameters are the entries of ``[batch]`` arrays; the update is optax's
formulas written once over the stacked leaves (each hyper-parameter broadcast along its
member's row), so member i steps as that optax optimizer steps member i alone, in one
elementwise pass per leaf as ``optax.adam`` over the stack. Inactive members get ``-0.0``
updates (``p + -0.0`` is ``p`` bit for bit, signed zeros included) and keep their state.
docs/batching.md, "Per-member hyper-parameters".
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualtrain.batching import hyper as hyper_checks
from dualtrain.batching.members import check_leading
from dualtrain.errors import bad_argument

__all__ = ["MemberState", "hyper_of", "member_optimizer", "set_active", "set_hyper"]

# Our names -> optax's names in the injected hyper-parameters.
_OPTAX_NAMES = {
    "lr": "learning_rate",
    "momentum": "momentum",
    "beta1": "b1",
    "beta2": "b2",
    "eps": "eps",
    "weight_decay": "weight_decay",
}


_READS = {
    "sgd": ("lr", "momentum", "weight_decay"),
    "adam": ("lr", "beta1", "beta2", "eps", "weight_decay"),
    "adamw": ("lr", "beta1", "beta2", "eps", "weight_decay"),
}


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class MemberState:
    """The state of `member_optimizer`: a pytree (jit, checkpoints), every leaf ``[batch]``-led.

    Attributes:
        inner: the vmapped ``optax.inject_hyperparams`` state: ``inner.hyperparams`` holds
            the ``[batch]`` hyper-parameters under optax's names (``learning_rate``,
            ``momentum``, ``b1``, ``b2``, ``eps``, ``weight_decay``); ``inner.count`` each
            member's step count.
        active: ``[batch]`` bools; False: the member does not step.
        max_grad_norm: ``[batch]`` clipping norms, or None (no clipping).
        name: ``"sgd"``, ``"adam"`` or ``"adamw"`` (static).
        nesterov: SGD's Nesterov flag (static).
    """

    inner: Any
    active: Any
    max_grad_norm: Any
    name: str
    nesterov: bool

    def tree_flatten(self) -> tuple[tuple[Any, Any, Any], tuple[str, bool]]:
        return (self.inner, self.active, self.max_grad_norm), (self.name, self.nesterov)

    @classmethod
    def tree_unflatten(cls, aux: tuple[str, bool], children: Any) -> MemberState:
        inner, active, clip = children
        name, nesterov = aux
        return cls(inner, active, clip, name, nesterov)


def _lead(values: Any, like: Any) -> Any:
    return jnp.reshape(values, (values.shape[0],) + (1,) * (jnp.ndim(like) - 1))


def _check_params(params: Any, batch: int) -> None:
    leaves = jax.tree.leaves(params)
    if not leaves:
        raise bad_argument("params", params, "a pytree of [batch, ...] arrays")
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        check_leading(f"params{jax.tree_util.keystr(path)}", jnp.shape(leaf), batch, "[batch, ...]")


def member_optimizer(
    name: str,
    batch: int,
    *,
    lr: object,
    momentum: object = 0.0,
    betas: object = (0.9, 0.999),
    eps: object = 1e-8,
    weight_decay: object = 0.0,
    nesterov: bool = False,
    max_grad_norm: object = None,
    active: object = None,
) -> optax.GradientTransformation:
    """An optax transformation that steps each member with its own hyper-parameters.

    Member i follows optax's ``sgd`` / ``adam`` / ``adamw`` run on member i alone with
    ``lr[i]``, ``momentum[i]``, ... (SGD's and Adam's weight decay is coupled L2, added to
    the gradient first as torch does; AdamW's decoupled). Same keywords and checks as
    ``dualtrain_torch.member_optimizer``, without its ``params`` (an optax transformation
    meets its params at ``init``). Change values between steps with `set_hyper` /
    `set_active` on the state (outside ``jit``: values are checked on the host).

    Args:
        name: ``"sgd"``, ``"adam"`` or ``"adamw"``.
        batch: the member count (every params leaf's leading dimension).
        lr: learning rates, >= 0; a float (every member) or ``[batch]`` values.
        momentum: SGD's momentum, >= 0 (SGD only).
        betas: Adam's ``(b1, b2)``, each in [0, 1) (Adam, AdamW only).
        eps: Adam's epsilon, >= 0 (Adam, AdamW only).
        weight_decay: >= 0.
        nesterov: SGD's Nesterov momentum (needs every member's momentum > 0); fixed.
        max_grad_norm: None (no clipping) or each member's clipping norm (``inf``: not
            clipped); member i's gradient is clipped as ``optax.clip_by_global_norm``
            clips member i's tree alone.
        active: None (all) or ``[batch]`` bools; inactive members get ``-0.0`` updates and
            keep their state, so params and state stay bit for bit as they were.

    Raises:
        ArgumentError: a bad name or value (as under torch).
        ShapeError: (at ``init``) a params leaf whose leading dimension is not `batch`.
    """
    hyper = hyper_checks.check_hyper(**locals())  # the arguments as called: none else yet

    def init(params: Any) -> MemberState:
        _check_params(params, hyper.batch)
        state = MemberState(
            inner=_initial(hyper.name, hyper.arrays(), params, hyper.batch),
            active=np.asarray(hyper.active),
            max_grad_norm=None if hyper.max_grad_norm is None else np.asarray(hyper.max_grad_norm),
            name=hyper.name,
            nesterov=hyper.nesterov,
        )
        # NumPy until here: building the state compiles nothing; one transfer places it.
        return _placed(jax.tree.map(jnp.asarray, state), jax.tree_util.tree_leaves(params)[0])

    def update(grads: Any, state: MemberState, params: Any = None) -> tuple[Any, MemberState]:
        if params is None:
            raise bad_argument("params", params, "the stacked params (weight decay reads them)")
        updates, inner = _step(state, grads, params)
        return updates, dataclasses.replace(state, inner=inner)

    return optax.GradientTransformation(init, update)


def _initial(name: str, values: dict[str, Any], params: Any, batch: int) -> Any:
    """The state ``jax.vmap(inject_hyperparams(...).init)`` builds, in NumPy."""
    dtype = np.dtype(optax.tree.dtype(params, "highest"))
    hyper = {_OPTAX_NAMES[k]: np.asarray(values[k], dtype) for k in _READS[name]}
    zeros = lambda: jax.tree.map(  # noqa: E731
        lambda p: np.zeros(np.shape(p), np.dtype(p.dtype)), params
    )
    count = np.zeros(batch, np.int32)
    empty = optax.EmptyState()
    if name == "sgd":
        inner: Any = (empty, (optax.TraceState(trace=zeros()), empty))
    else:
        moments = optax.ScaleByAdamState(count=count.copy(), mu=zeros(), nu=zeros())
        inner = (moments, empty, empty) if name == "adamw" else (empty, (moments, empty))
    return optax.InjectStatefulHyperparamsState(
        count=count, hyperparams=hyper, hyperparams_states={}, inner_state=inner
    )


def _safe_increment(count: Any) -> Any:
    """``count + 1``, staying at the dtype's maximum (optax's safe_increment)."""
    top = jnp.asarray(jnp.iinfo(count.dtype).max, count.dtype)
    return jnp.where(count < top, count + jnp.asarray(1, count.dtype), top)


def _clip(grads: Any, max_norm: Any) -> Any:
    """Each member's gradient clipped by its own global norm, as optax.clip_by_global_norm."""
    squares = [
        jnp.sum(jnp.square(g), axis=tuple(range(1, jnp.ndim(g)))) for g in jax.tree.leaves(grads)
    ]
    norm = jnp.sqrt(functools.reduce(operator.add, squares, 0))
    keep = norm < max_norm

    def clip(t: Any) -> Any:
        scaled = (t / _lead(norm.astype(t.dtype), t)) * _lead(max_norm, t)
        return jnp.where(_lead(keep, t), t, scaled.astype(t.dtype))

    return jax.tree.map(clip, grads)


def _step(state: MemberState, grads: Any, params: Any) -> tuple[Any, Any]:
    """Optax's update of every member at once: ``(updates, inner state)``.

    The formulas and their order of operations are optax's (``add_decayed_weights``,
    ``trace``, ``scale_by_adam``, ``scale_by_learning_rate`` inside
    ``inject_hyperparams``), with each ``[batch]`` hyper-parameter broadcast along its
    member's rows, so member i gets what optax computes for member i alone. An inactive
    member keeps its state and gets ``-0.0`` updates. The update is computed from the
    state as kept (the same values for active members), so XLA reads the new moments it
    writes instead of recomputing them from the old ones (one pass fewer over them).
    """
    inner, active = state.inner, state.active
    dtype = optax.tree.dtype(params, "highest")
    # inject_hyperparams hands its factory the values in the params' dtype
    hp = {
        k: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v
        for k, v in inner.hyperparams.items()
    }
    if state.max_grad_norm is not None:
        grads = _clip(grads, state.max_grad_norm)
    at = lambda name, like: _lead(hp[name], like)  # noqa: E731
    keep = lambda new, old: jnp.where(_lead(active, new), new, old)  # noqa: E731
    decay = lambda g, p: g + at("weight_decay", g) * p  # noqa: E731
    if state.name == "sgd":
        empty, (trace, last) = inner.inner_state
        grads = jax.tree.map(decay, grads, params)
        momentum = lambda g, t: g + at("momentum", g) * t  # noqa: E731
        new_trace = jax.tree.map(keep, jax.tree.map(momentum, grads, trace.trace), trace.trace)
        out = jax.tree.map(momentum, grads, new_trace) if state.nesterov else new_trace
        inner_state: Any = (empty, (optax.TraceState(trace=new_trace), last))
    else:
        if state.name == "adamw":
            moments, *rest = inner.inner_state
        else:
            empty, (moments, last) = inner.inner_state
            grads = jax.tree.map(decay, grads, params)
        count = _safe_increment(moments.count)
        mu = jax.tree.map(
            lambda g, t: (1 - at("b1", g)) * (g**1) + at("b1", g) * t, grads, moments.mu
        )
        nu = jax.tree.map(
            lambda g, t: (1 - at("b2", g)) * (g**2) + at("b2", g) * t, grads, moments.nu
        )
        nu = jax.tree.map(lambda new, old: new.astype(old.dtype), nu, moments.nu)
        mu, nu = jax.tree.map(keep, mu, moments.mu), jax.tree.map(keep, nu, moments.nu)

        def corrected(t: Any, decay_rate: str) -> Any:
            bias = 1 - hp[decay_rate] ** count
            return t / _lead(bias.astype(t.dtype), t)

        out = jax.tree.map(
            lambda m, v: corrected(m, "b1") / (jnp.sqrt(corrected(v, "b2") + 0.0) + at("eps", m)),
            mu,
            nu,
        )
        moments = optax.ScaleByAdamState(count=keep(count, moments.count), mu=mu, nu=nu)
        if state.name == "adamw":
            out = jax.tree.map(decay, out, params)
            inner_state = (moments, *rest)
        else:
            inner_state = (empty, (moments, last))
    # -0.0 is the identity of addition for every float, +0.0 and -0.0 included.
    updates = jax.tree.map(
        lambda u: keep(_lead(-1 * hp["learning_rate"], u) * u, jnp.asarray(-0.0, u.dtype)), out
    )
    new_inner = optax.InjectStatefulHyperparamsState(
        count=keep(_safe_increment(inner.count), inner.count),
        hyperparams=hp,
        hyperparams_states=inner.hyperparams_states,
        inner_state=inner_state,
    )
    return updates, new_inner


def hyper_of(state: MemberState) -> hyper_checks.MemberHyper:
    """The state's hyper-parameters as NumPy arrays (host values: call outside ``jit``)."""
    if not isinstance(state, MemberState):
        raise bad_argument("state", type(state), "a member_optimizer state (MemberState)")
    _check_concrete("state", state)
    found = state.inner.hyperparams
    batch = int(np.shape(state.active)[0])
    defaults = {"momentum": 0.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
    numbers = {
        k: np.asarray(found[_OPTAX_NAMES[k]], np.float64)
        if _OPTAX_NAMES[k] in found
        else np.full(batch, defaults[k])
        for k in _OPTAX_NAMES
    }
    clip = state.max_grad_norm
    return hyper_checks.MemberHyper(
        name=state.name,
        batch=batch,
        nesterov=state.nesterov,
        max_grad_norm=None if clip is None else np.asarray(clip, np.float64),
        active=np.asarray(state.active, np.bool_),
        **numbers,
    )


def _check_concrete(name: str, tree: Any) -> None:
    """Refuses traced values (inside ``jit``): the values are checked on the host."""
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree)):
        raise bad_argument(
            name,
            "a traced value",
            "concrete: call set_hyper / set_active / hyper_of outside jit (between steps), "
            "or change state.inner.hyperparams[...] inside it, unchecked",
        )


def set_hyper(state: MemberState, **changes: object) -> MemberState:
    """`state` with hyper-parameters changed; moments and step counts are kept.

    Keywords: ``lr``, ``weight_decay``, ``momentum`` (SGD), ``betas``, ``eps`` (Adam,
    AdamW), ``max_grad_norm`` (if built with one), ``active``; each a float or ``[batch]``
    values.

    Raises:
        ArgumentError: an unknown keyword or a bad value (as under torch).
    """
    hyper = hyper_of(state)
    _check_concrete("set_hyper's values", changes)
    new = hyper_checks.check_changes(hyper, changes)
    found = dict(state.inner.hyperparams)
    for key, value in new.arrays().items():
        name = _OPTAX_NAMES.get(key)
        if name in found:
            found[name] = jnp.asarray(value, dtype=found[name].dtype)
    clip = state.max_grad_norm
    changed = dataclasses.replace(
        state,
        inner=state.inner._replace(hyperparams=found),
        active=jnp.asarray(new.active),
        max_grad_norm=None if clip is None else jnp.asarray(new.max_grad_norm, clip.dtype),
    )
    return _placed(changed, jax.tree_util.tree_leaves(state.inner)[0])


def _placed(tree: Any, like: Any) -> Any:
    """`tree` on `like`'s device when `like` is committed to one device.

    A jitted step keys its compilation on where its arguments are committed: a state of
    uncommitted arrays beside committed params made the step compile once more after its
    first call (its outputs are committed), and again after each `set_active`.
    """
    sharding = getattr(like, "sharding", None)
    if not getattr(like, "committed", False) or not isinstance(
        sharding, jax.sharding.SingleDeviceSharding
    ):
        return tree
    return jax.device_put(tree, sharding)


def set_active(state: MemberState, active: object) -> MemberState:
    """`state` with `active` (``[batch]`` bools; None: all) as the members that step."""
    return set_hyper(state, active=active)
