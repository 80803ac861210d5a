"""Top-k sparsified backprop (meProp) for ``dock.Dense`` layers under JAX: opt-in, approximate.

`topk_dense` is the dense layer (``(out, in)`` weight, as `dualtrain_jax.layers`) with a
``jax.custom_vjp``: the forward is exact, the backward keeps each row's k largest output
gradients (see `dualtrain.accelerate.topk` for the maths). `patch_dense` returns a new module,
a `TopKJaxModule`, whose `apply` runs every Dense through it; the k of each layer travels in
the pytree's static data, so the patch survives ``jit``, ``grad``, ``vmap`` and ``tree_map``.
A layer whose k reaches its ``out_features`` runs the ordinary Dense: exact gradients.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dualtrain.accelerate.topk import Approximation, resolve_k
from dualtrain.craft import Craft, dock
from dualtrain.errors import bad_argument
from dualtrain_jax.craft import JaxModule
from dualtrain_jax.layers import LAYERS

__all__ = [
    "approximations",
    "TopKJaxModule",
    "keep_topk",
    "patch_dense",
    "topk_dense",
    "unpatch_dense",
]


def keep_topk(grad: jax.Array, k: int) -> jax.Array:
    """`grad` with all but each row's k largest ``|grad|`` (over the last axis) zeroed.

    Ties keep the lower index (``lax.top_k``'s rule), as `topk_reference`.
    """
    features = grad.shape[-1]
    if k >= features:
        return grad
    flat = grad.reshape(-1, features)
    _, index = lax.top_k(jnp.abs(flat), k)
    rows = jnp.arange(flat.shape[0])[:, None]
    kept = jnp.zeros_like(flat).at[rows, index].set(flat[rows, index])
    return kept.reshape(grad.shape)


def _exact(x: jax.Array, weight: jax.Array, bias: jax.Array | None) -> jax.Array:
    # The same ops as dualtrain_jax.layers._dense, so the dense case is bit for bit the same.
    y = lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())))
    return y if bias is None else y + bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _sparse(x: jax.Array, weight: jax.Array, bias: jax.Array | None, k: int) -> jax.Array:
    return _exact(x, weight, bias)


def _sparse_fwd(
    x: jax.Array, weight: jax.Array, bias: jax.Array | None, k: int
) -> tuple[jax.Array, tuple[Any, ...]]:
    return _exact(x, weight, bias), (x, weight, bias)


def _sparse_bwd(k: int, residuals: tuple[Any, ...], grad: jax.Array) -> tuple[Any, ...]:
    x, weight, bias = residuals
    out_features, in_features = weight.shape
    kept = keep_topk(grad, k)
    grad_x = lax.dot_general(kept, weight, (((kept.ndim - 1,), (0,)), ((), ())))
    grad_w = lax.dot_general(
        kept.reshape(-1, out_features), x.reshape(-1, in_features), (((0,), (0,)), ((), ()))
    )
    # The bias gradient stays dense, as in the meProp paper: it is free.
    grad_b = None if bias is None else grad.reshape(-1, out_features).sum(0).astype(bias.dtype)
    return grad_x.astype(x.dtype), grad_w.astype(weight.dtype), grad_b


_sparse.defvjp(_sparse_fwd, _sparse_bwd)


def topk_dense(x: jax.Array, weight: jax.Array, bias: jax.Array | None, k: int) -> jax.Array:
    """The Dense layer ``x @ weight.T + bias`` whose backward keeps each row's k largest.

    Args:
        x: input ``[..., in]``, any rank >= 1.
        weight: ``(out, in)``, the canonical layout.
        bias: ``(out,)`` or None.
        k: a Python int >= 1 (static under ``jit``); ``k >= out`` is the exact Dense.

    Raises:
        ArgumentError: `k` is not an int >= 1.
    """
    k = resolve_k(weight.shape[0], k=k)
    if k >= weight.shape[0]:
        return _exact(x, weight, bias)
    return _sparse(x, weight, bias, k)


@jax.tree_util.register_pytree_node_class
class TopKJaxModule(JaxModule):
    """A `JaxModule` whose Dense layers backpropagate through their top-k output gradients.

    Made by `patch_dense`. Its own pytree class: the static data carries the Craft, the mode
    and `topk`, so every transformation hands back a module with the same patch.

    Attributes:
        topk: ``((layer name, k), ...)`` for each Dense layer, sorted by name.
    """

    def __init__(
        self,
        craft: Craft,
        params: dict[str, Any],
        state: dict[str, Any],
        train: bool = False,
        topk: tuple[tuple[str, int], ...] = (),
    ) -> None:
        super().__init__(craft, params, state, train=train)
        self.topk = tuple(sorted(topk))

    def _statics(self) -> dict[str, Any]:  # flattened, unflattened and replaced with it
        return {"topk": self.topk}

    def _layer_table(self) -> dict[type, Any]:
        by_name = dict(self.topk)
        by_id = {i: by_name[n] for i, n in self.craft.layer_names().items() if n in by_name}
        plain = LAYERS[dock.Dense]

        def dense(spec: dock.Dense, view: Any, x: jax.Array) -> jax.Array:
            k = by_id.get(id(spec))
            if k is None or k >= spec.out_features:
                return plain(spec, view, x)
            return _sparse(x, view["weight"], view["bias"] if spec.bias else None, k)

        return {**LAYERS, dock.Dense: dense}

    def __repr__(self) -> str:
        return f"TopK{super().__repr__()[:-1]}, top-k backprop on {len(self.topk)} Dense)"


def patch_dense(
    module: JaxModule, *, k: int | None = None, ratio: float | None = None
) -> tuple[TopKJaxModule, list[Approximation]]:
    """A copy of `module` whose every ``dock.Dense`` has top-k backprop; `module` is untouched.

    Each layer's k comes from `resolve_k` with its ``out_features``: a given `k` for all,
    else ``max(1, round(ratio * out_features))``. Patching a patched module re-patches it.

    Args:
        module: a realized `JaxModule` (or a `TopKJaxModule`).
        k: output gradients kept per row, an int >= 1 (exclusive with `ratio`).
        ratio: fraction of each layer's outputs kept, in (0, 1]; default 0.04.

    Returns:
        The new module (same arrays, same mode) and one `Approximation` per Dense layer,
        named as its parameters (``"fc"`` for ``"fc.weight"``); ``dense`` True means exact.

    Raises:
        ArgumentError: `module` is not a `JaxModule`, or a bad `k`/`ratio`.
    """
    if not isinstance(module, JaxModule):
        raise bad_argument("module", module, "a realized dualtrain_jax.JaxModule")
    resolve_k(1, k=k, ratio=ratio)  # validate even when there is no Dense layer
    seen: set[int] = set()
    found: list[Approximation] = []
    for name, layer in module.craft.named_layers():
        if type(layer) is dock.Dense and id(layer) not in seen:
            seen.add(id(layer))
            found.append(
                Approximation(name, layer.out_features, resolve_k(layer.out_features, k, ratio))
            )
    patched = TopKJaxModule(
        module.craft,
        dict(module.params),
        dict(module.state),
        train=module.train,
        topk=tuple((a.layer, a.k) for a in found),
    )
    return patched, found


def approximations(module: JaxModule) -> list[Approximation]:
    """What `module` approximates: one record per top-k Dense layer (none: exact).

    Read from the module (a `TopKJaxModule`'s ``topk``), so a module patched before it was
    accelerated reports its approximations too.
    """
    kept = dict(getattr(module, "topk", ()))
    found: dict[str, Approximation] = {}
    for name, layer in module.craft.named_layers():
        if type(layer) is dock.Dense and name in kept and name not in found:
            found[name] = Approximation(name, layer.out_features, kept[name])
    return list(found.values())


def unpatch_dense(module: JaxModule) -> JaxModule:
    """A plain `JaxModule` holding `module`'s arrays and mode (exact backprop again)."""
    if not isinstance(module, JaxModule):
        raise bad_argument("module", module, "a realized dualtrain_jax.JaxModule")
    return JaxModule(module.craft, dict(module.params), dict(module.state), train=module.train)
