"""optax state in an anchor: any state natively (its pytree), five families across frameworks.

Native form: the state's pytree, its structure in the manifest's JSON (containers, named
tuples with their type and field names, dict keys, each leaf's shape and dtype) and its
array leaves in the file as ``optimizer<path>`` (``optimizer[0].mu['fc.weight']``). It is
loaded into the structure of the optax state you pass (``tx.init(params)`` of the optimizer
you resume with), refused where the two structures differ. The neutral view
(`neutral_view`, in ``dualtrain_jax.optimizer_neutral``) maps optax's sgd, adam/adamw,
rmsprop and adagrad states onto ``dualtrain.checkpoint.optim_state``'s families.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualtrain import dtypes
from dualtrain.checkpoint.optim_state import OptimizerState
from dualtrain.errors import ArgumentError, CheckpointError
from dualtrain_jax.craft import JaxModule
from dualtrain_jax.optimizer_neutral import check_neutral, is_namedtuple, neutral_view, type_name

__all__ = [
    "check_native",
    "check_neutral",
    "export_native",
    "export_optimizer",
    "import_optimizer",
    "neutral_view",
]

_LEAVES = (jax.Array, np.ndarray, np.generic)
_SCALARS = (bool, int, float)
# safetensors' dtypes (that every framework has); a leaf of another dtype is refused at drop.
_STORABLE = dtypes.STORED_NAMES


class _UnstorableError(Exception):
    """A part of a state with no tensor-or-JSON form."""


def _children(x: Any) -> tuple[str, list[tuple[str, Any]]] | None:
    """A pytree node's kind and ``(path segment, child)`` pairs; None for a leaf."""
    if x is None:
        return "none", []
    if isinstance(x, dict):
        return "dict", [(f"[{k!r}]", v) for k, v in x.items()]
    if is_namedtuple(x):
        return "namedtuple", [(f".{f}", getattr(x, f)) for f in x._fields]
    if isinstance(x, (tuple, list)):
        return type(x).__name__, [(f"[{i}]", v) for i, v in enumerate(x)]
    if isinstance(x, (*_LEAVES, *_SCALARS)):
        return None
    pairs, treedef = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    if jax.tree_util.treedef_is_leaf(treedef):
        return None
    return "node", [(jax.tree_util.keystr(p), c) for p, c in pairs]


def _what(desc: dict[str, Any]) -> str:
    kind = desc.get("kind")
    if kind in ("namedtuple", "node"):
        return str(desc.get("type"))
    if kind in ("tuple", "list"):
        return f"a {kind} of {len(desc.get('children', []))}"
    if kind == "dict":
        return "a dict"
    if kind == "none":
        return "None"
    return f"a leaf {desc.get('shape', '')}"


# ---- native ------------------------------------------------------------------------------


def export_native(
    module: JaxModule, opt_state: Any, keep: Callable[[str], bool]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The optax state as (manifest entry with its structure, tensors of its array leaves).

    A leaf under a dict key that names one of the module's arrays belongs to that array's
    parameter; only those for which `keep` is true are stored.

    Raises:
        ArgumentError: the state holds something that is neither a container nor an array
            or number (a function, a string, ...), naming where.
    """
    if isinstance(opt_state, optax.GradientTransformation):
        raise ArgumentError(
            "optimizer must be an optax state (tx.init(params)), not the transformation; "
            f"got optimizer={type(opt_state).__name__}"
        )
    params = set(module.params) | set(module.state)
    tensors: dict[str, np.ndarray] = {}
    info: dict[str, dict[str, Any]] = {}

    def walk(x: Any, path: str, param: str | None) -> dict[str, Any]:
        kids = _children(x)
        if kids is None:
            if isinstance(x, _SCALARS):
                return {"kind": "scalar", "type": type(x).__name__, "value": x, "param": param}
            if not isinstance(x, _LEAVES):
                raise _UnstorableError(f"{path or 'the state'} is a {type(x).__name__}")
            impl = None
            if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                # a typed key: its bits
                impl, x = str(jax.random.key_impl(x)), jax.random.key_data(x)
            array = np.asarray(x)
            if array.dtype.name not in _STORABLE:
                raise _UnstorableError(f"{path or 'the state'} has dtype {array.dtype.name}")
            name = "optimizer" + path
            stored = param is None or keep(param)
            if stored:
                tensors[name] = array
                info[name] = {"shape": list(array.shape), "dtype": array.dtype.name}
                info[name]["param"] = param
            desc: dict[str, Any] = {
                "kind": "array",
                "shape": list(array.shape),
                "dtype": array.dtype.name,
                "tensor": name if stored else None,
                "param": param,
            }
            if impl is not None:
                desc["key_impl"] = impl
            return desc
        kind, items = kids
        desc = {"kind": kind}
        if kind == "dict":
            if not all(isinstance(k, str) for k in x):
                raise _UnstorableError(
                    f"{path or 'the state'} is a dict with keys that are not str"
                )
            desc["keys"] = list(x)
            desc["children"] = [
                walk(v, path + seg, k if k in params else param)
                for (seg, v), k in zip(items, x, strict=True)
            ]
            return desc
        if kind in ("namedtuple", "node"):
            desc["type"], desc["module"] = type_name(x), type(x).__module__
        if kind == "namedtuple":
            desc["fields"] = list(x._fields)
        if kind == "node":
            desc["paths"] = [seg for seg, _ in items]
        desc["children"] = [walk(v, path + seg, param) for seg, v in items]
        return desc

    try:
        tree = walk(opt_state, "", None)
    except _UnstorableError as why:
        raise ArgumentError(
            f"optimizer state cannot be stored: {why}; an optax state holds containers, "
            "arrays and numbers"
        ) from None
    entry = {"tree": tree, "params": sorted(params), "tensors": info}
    return entry, tensors


def check_native(
    module: JaxModule,
    opt_state: Any,
    entry: dict[str, Any],
    tensors: dict[str, Any],
    loaded: set[str],
) -> Callable[[], Any]:
    """Validates a native entry against the optax state given; returns its filler.

    The filler gives the filled state. The stored structure must match `opt_state`'s,
    except dict keys that name parameters (one side may have parameters the other lacks).
    Leaves of parameters not in `loaded` keep `opt_state`'s values; the others take the
    stored ones, cast to its dtypes.

    Raises:
        CheckpointError: naming the first place where the structures differ.
    """
    names = set(entry.get("params", [])) | set(module.params) | set(module.state)

    def differ(path: str, what: str) -> CheckpointError:
        return CheckpointError(
            f"the optax state given does not match the anchor's at {path or 'the root'}: {what}"
        )

    def leaf(x: Any, desc: dict[str, Any], path: str, param: str | None) -> Any:
        if desc.get("kind") not in ("array", "scalar"):
            raise differ(path, f"{_what(desc)} on disk, a leaf in the state given")
        if param is not None and param not in loaded:
            return x
        if desc["kind"] == "scalar":
            value = np.asarray(desc["value"])
        elif desc.get("tensor") is None:
            return x  # left out by save_scope
        else:
            value = np.asarray(tensors[desc["tensor"]])
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            impl, data = str(jax.random.key_impl(x)), jax.random.key_data(x)
            if desc.get("key_impl") != impl or value.shape != data.shape:
                raise differ(
                    path,
                    f"{desc.get('key_impl')} key data {value.shape} on disk, a {impl} key "
                    f"{data.shape} in the state given",
                )
            return jax.random.wrap_key_data(jnp.asarray(value, dtype=data.dtype), impl=impl)
        if desc.get("key_impl") is not None:
            raise differ(path, f"a {desc['key_impl']} key on disk, an array in the state given")
        if value.shape != np.shape(x):
            raise differ(path, f"shape {value.shape} on disk, {np.shape(x)} in the state given")
        if isinstance(x, jax.Array):
            return jnp.asarray(value, dtype=x.dtype)
        if isinstance(x, (np.ndarray, np.generic)):
            return np.asarray(value, dtype=x.dtype)[()] if x.ndim == 0 else value.astype(x.dtype)
        return type(x)(value.item())

    def rebuild(x: Any, desc: dict[str, Any], path: str, param: str | None) -> Any:
        kids = _children(x)
        if kids is None:
            return leaf(x, desc, path, param)
        kind, items = kids
        if kind != desc.get("kind") or (
            kind in ("namedtuple", "node") and desc.get("type") != type_name(x)
        ):
            given = type_name(x) if kind in ("namedtuple", "node") else f"a {kind}"
            raise differ(path, f"{_what(desc)} on disk, {given} in the state given")
        stored = desc.get("children", [])
        if kind == "dict":
            disk = dict(zip(desc.get("keys", []), stored, strict=True))
            extra = sorted(k for k in set(disk) - set(x) if k not in names)
            missing = sorted(k for k in set(x) - set(disk) if k not in names)
            if extra or missing:
                raise differ(path, f"keys {extra} only on disk, {missing} only in the state given")
            return {
                k: rebuild(v, disk[k], path + seg, k if k in names else param) if k in disk else v
                for (seg, v), k in zip(items, x, strict=True)
            }
        if kind == "namedtuple" and desc.get("fields") != list(x._fields):
            raise differ(path, f"fields {desc.get('fields')} on disk, {list(x._fields)} given")
        if kind == "node" and desc.get("paths") != [seg for seg, _ in items]:
            raise differ(path, f"children {desc.get('paths')} on disk, {[s for s, _ in items]}")
        # Children first, so the first one that differs is named rather than just a count.
        children = [
            rebuild(v, d, path + seg, param) for (seg, v), d in zip(items, stored, strict=False)
        ]
        if len(stored) != len(items):
            raise differ(path, f"{len(stored)} children on disk, {len(items)} in the state given")
        if kind == "none":
            return None
        if kind == "namedtuple":
            return type(x)(*children)
        if kind in ("tuple", "list"):
            return type(x)(children)
        treedef = jax.tree_util.tree_structure(x, is_leaf=lambda y: y is not x)
        return jax.tree_util.tree_unflatten(treedef, children)

    tree = entry.get("tree")
    if not isinstance(tree, dict):
        raise CheckpointError("the optimizer entry has no structure ('tree')")
    filled = rebuild(opt_state, tree, "", None)
    return lambda: filled


# ---- neutral (dualtrain_jax.optimizer_neutral), as arrays --------------------------------


def export_optimizer(module: JaxModule, opt_state: Any) -> OptimizerState:
    """The optax state in neutral form (arrays), keyed by the module's parameter names.

    Raises:
        NotPortableError: the state has no neutral form.
    """
    view = neutral_view(module, opt_state)
    _, tensors = export_native(module, opt_state, lambda name: True)
    view.slots = {
        slot: {k: tensors[t] for k, t in values.items()} for slot, values in view.slots.items()
    }
    return view


def import_optimizer(module: JaxModule, opt_state: Any, state: OptimizerState) -> Any:
    """A copy of `opt_state` (from the optax optimizer you resume with) filled from `state`."""
    loaded = set(module.params) | set(module.state)
    return check_neutral(module, opt_state, state, loaded)()
