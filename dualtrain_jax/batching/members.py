"""The members of a JAX BatchModule: how one member runs, its values, its architecture."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dualtrain.batching import members
from dualtrain.errors import bad_argument
from dualtrain.interop import convert
from dualtrain_jax.craft import JaxModule

__all__ = [
    "Spec",
    "craft_member",
    "craft_values",
    "entries_of",
    "kind_of",
    "pair_member",
    "pair_values",
    "row",
    "row_shapes",
]


def entries_of(params: dict[str, Any], state: dict[str, Any]) -> list[members.Entry]:
    """Every param, then state array: (name, shape, dtype name, trainable)."""
    return [
        (name, tuple(np.shape(v)), np.dtype(_dtype(v)).name, trainable)
        for tree, trainable in ((params, True), (state, False))
        for name, v in _flat(tree).items()
    ]


def _dtype(value: Any) -> Any:
    return value.dtype if hasattr(value, "dtype") else jnp.asarray(value).dtype


def _flat(tree: Any) -> dict[str, Any]:
    if isinstance(tree, dict) and all(
        not isinstance(v, (dict, list, tuple)) for v in tree.values()
    ):
        return dict(tree)
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): leaf for path, leaf in flat}


@dataclasses.dataclass(eq=False)  # compared and hashed by identity: jit's cache key
class Spec:
    """How a BatchModule runs one member, kept outside its leaves.

    The decisions are the skeleton's (`dualtrain.batching.skeleton.MemberBatch`).
    """

    one: Callable[..., tuple[Any, Any]]
    kind: str
    template: JaxModule | None
    apply_fn: Callable[..., Any] | None
    entries: list[members.Entry]

    def __post_init__(self) -> None:
        self.arch = members.architecture_key(self.kind, self.entries)  # built once, keyed often


# Classes, not closures, so a BatchModule pickles as a JaxModule does; compared and hashed
# by identity, as the closures were (the key of the loop strategy's jit cache).
class _CraftMember:
    def __init__(self, template: JaxModule) -> None:
        self.template = template

    def __call__(self, p: Any, s: Any, key: Any, train: bool, *x: Any) -> tuple[Any, Any]:
        return self.template.apply(p, s, *x, train=train, rng=key)


class _PairMember:
    def __init__(self, apply_fn: Callable[..., Any]) -> None:
        self.apply_fn = apply_fn

    def __call__(self, p: Any, s: Any, key: Any, train: bool, *x: Any) -> tuple[Any, Any]:
        return (self.apply_fn(p, *x) if key is None else self.apply_fn(p, *x, rng=key)), s


def craft_member(template: JaxModule) -> Callable[..., tuple[Any, Any]]:
    """One member of a realized Craft: ``one(params, state, key, train, *inputs)``."""
    return _CraftMember(template)


def pair_member(apply_fn: Callable[..., Any]) -> Callable[..., tuple[Any, Any]]:
    """One member of a ``(params, apply_fn)`` pair; its state stays ``{}``."""
    return _PairMember(apply_fn)


def _keys(seeds: Sequence[int]) -> jax.Array:
    """Raw threefry keys of 64-bit seeds, as ``jax.random.PRNGKey(seed)`` lays them out."""
    words = np.array([[s >> 32, s & 0xFFFFFFFF] for s in seeds], dtype=np.uint32)
    return jnp.asarray(words)


def craft_values(
    module: JaxModule, batch: int, init: str, seeds: Sequence[int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stacked params and state of a Craft's members, drawn as `realize` draws them."""
    if init == "identical":
        return _map(lambda v: _copies(v, batch), module.params), _map(
            lambda v: _copies(v, batch), module.state
        )
    dtype = next(iter(module.params.values())).dtype.name
    draws = [module.craft.init(s, dtype) for s in seeds]  # NumPy, as realize draws them
    stacked = {name: np.stack([d[name] for d in draws]) for name in draws[0]}
    values = convert(stacked, to="jax")
    params = {k: values[k] for k in module.params}
    state = {k: values[k] for k in module.state}
    return params, state


def pair_values(first: Any, batch: int, init: str, seeds: Sequence[int]) -> Any:
    """Stacked params of a pair's members: one vmapped ``init_fn`` or copies of params."""
    if callable(first):
        keys = _keys(seeds)
        if init == "identical":
            return jax.tree_util.tree_map(lambda v: _copies(v, batch), first(keys[0]))
        return jax.vmap(first)(keys)  # one vmapped init
    if init == "independent":
        raise bad_argument(
            "init",
            "independent",
            "'identical' for a (params, apply_fn) pair, or pass (init_fn, apply_fn) so "
            "each member draws its own params",
        )
    return jax.tree_util.tree_map(lambda v: _copies(v, batch), first)


def _copies(value: Any, batch: int) -> Any:
    """`batch` copies of `value` stacked, where `value` lives.

    Stacked in NumPy and transferred once: an eager ``broadcast_to(...).copy()`` compiled
    two XLA programs per shape, about a second for a small MLP on a cold cache.
    """
    if isinstance(value, jax.core.Tracer):
        return jnp.broadcast_to(value, (batch, *value.shape))
    host = np.asarray(value)
    stacked = np.ascontiguousarray(np.broadcast_to(host, (batch, *host.shape)))
    sharding = getattr(value, "sharding", None)
    if isinstance(value, jax.Array) and getattr(value, "committed", False):
        return jax.device_put(stacked, sharding)
    return jnp.asarray(stacked)


def kind_of(module: Any) -> str:
    """The architecture's name, for messages and the cache key."""
    if isinstance(module, JaxModule):
        return f"{type(module.craft).__qualname__} (a realized Craft)"
    return "a (params, apply_fn) pair"


def _map(fn: Callable[[Any], Any], tree: dict[str, Any]) -> dict[str, Any]:
    return {k: fn(v) for k, v in tree.items()}


def row(tree: Any, index: int) -> Any:
    """Member `index` of a stacked pytree."""
    return jax.tree_util.tree_map(lambda a: a[index], tree)


def row_shapes(tree: Any) -> Any:
    """One member's shapes and dtypes (``jax.ShapeDtypeStruct``): no slicing, no compile."""
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), tree)
