"""What tells two calls apart and what a decision depends on, for JAX.

A call's arguments are split once per input signature (`Layout`): array leaves and Python
numbers are traced, as ``jax.jit`` traces them; any other leaf (a string, an enum, an
object) is held fixed and is part of the signature by value. `call_key` is that signature
as a hashable tuple (shardings as small ints), so a call already seen costs one flatten and
one dict look-up. `module_parts` and `platform_parts` are what a module's decisions depend
on besides it: the Craft's structure, the code of every ``run``, the versions, the device.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dualtrain.accelerate.decisions import code_digest
from dualtrain.craft import Craft
from dualtrain_jax.craft import JaxModule

__all__ = ["NUMBERS", "Layout", "call_key", "eps", "module_parts", "platform_parts"]


NUMBERS = (bool, int, float, complex)  # jax.jit traces these as weak-typed scalars


# jaxlib's concrete array class (never a tracer), found at the first call: making an array
# at import would start JAX's backend, after which jax.distributed.initialize (Multiverse)
# can no longer run in this process.
_ARRAY: Any = None


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _SkipError(Exception):
    """A call the ladder leaves alone: traced, or holding an unhashable fixed leaf."""


def _leaf_key(leaf: Any) -> Any:
    if isinstance(leaf, jax.core.Tracer):
        raise _SkipError
    if isinstance(leaf, jax.Array):
        return (leaf.shape, leaf.dtype, getattr(leaf, "weak_type", False), leaf.sharding)
    if isinstance(leaf, (np.ndarray, np.generic)):
        return ("numpy", np.shape(leaf), leaf.dtype)
    if type(leaf) in NUMBERS:
        return type(leaf)
    try:
        hash(leaf)
    except TypeError:
        raise _SkipError from None
    return ("fixed", type(leaf), leaf)


def call_key(tree: Any) -> tuple[Any, list[Any], Any] | None:
    """``(key, leaves, treedef)`` of a call's arguments, or None when the ladder must not run.

    The key is what the signature is made of (structure, each array's shape, dtype, weak
    type and sharding, each number's type, each other leaf's value) as a hashable tuple, so
    a call already seen costs one flatten and one dict look-up. None: a leaf is a tracer
    (the call is inside the user's own jit/grad/vmap) or a fixed leaf is unhashable.
    """
    global _ARRAY
    if _ARRAY is None:
        _ARRAY = type(jnp.zeros(()))
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    try:
        # The common leaf, a concrete array, inline: this runs on every call. Its sharding
        # enters the key as a small int (`_sharding_token`): shardings hash and compare in
        # Python, which cost more per call than a small model's jitted step on a GPU.
        keys = tuple(
            [
                (x.shape, x.dtype, x.weak_type, _sharding_token(x.sharding))
                if type(x) is _ARRAY
                else _leaf_key(x)
                for x in leaves
            ]
        )
    except _SkipError:
        return None
    return (treedef, keys), leaves, treedef


# id(sharding) -> (the sharding, its token). The sharding is held, so its id is not reused
# while it is here; equal shardings met as different objects share one token.
_BY_ID: dict[int, tuple[Any, int]] = {}


_BY_VALUE: dict[Any, int] = {}


_TOKENS_KEPT = 4096


def _sharding_token(sharding: Any) -> int:
    known = _BY_ID.get(id(sharding))
    if known is not None:
        return known[1]
    if len(_BY_ID) >= _TOKENS_KEPT:
        _BY_ID.clear()  # the tokens by value stay: keys made earlier remain valid
    token = _BY_VALUE.setdefault(sharding, len(_BY_VALUE))
    _BY_ID[id(sharding)] = (sharding, token)
    return token


def _place(x: jax.Array) -> str:
    sharding = x.sharding
    devices = sharding.device_set
    if len(devices) == 1:
        (device,) = devices
        return f"{device.platform}:{device.id}"  # type: ignore[attr-defined]
    return f"{type(sharding).__name__}({len(devices)} devices)"


def _describe_leaf(leaf: Any) -> str:
    if isinstance(leaf, jax.Array):
        weak = " weak" if getattr(leaf, "weak_type", False) else ""
        return f"{leaf.dtype}[{','.join(map(str, leaf.shape))}]{weak}"
    if isinstance(leaf, (np.ndarray, np.generic)):
        return f"numpy {leaf.dtype}[{','.join(map(str, np.shape(leaf)))}]"
    if type(leaf) in NUMBERS:
        return type(leaf).__name__
    text = repr(leaf)
    return "=" + (text if len(text) <= 24 else text[:21] + "...")


def _describe(tree: Any) -> str:
    leaves = jax.tree_util.tree_leaves(tree)
    if len(leaves) == 1 and leaves[0] is tree:
        return _describe_leaf(tree)
    if not leaves:
        return "()" if isinstance(tree, tuple) else type(tree).__name__ + "()"
    if len(leaves) <= 3:
        return "(" + ", ".join(_describe_leaf(x) for x in leaves) + ")"
    return f"{type(tree).__name__}[{len(leaves)} leaves]"


@dataclass(frozen=True)
class Layout:
    """How one signature's arguments flatten: which leaves are traced, which are held fixed.

    Attributes:
        treedef: the structure of ``(args, kwargs)``.
        fixed: leaf index -> the value held fixed (not traced) for this signature.
        traced: indices of the traced leaves, in order.
        starts: where each positional argument's leaves start, then the first kwargs leaf.
        signature: the signature as text: a short description and a digest of the full key.
        floor: the least precise floating dtype among the array leaves (None: none below
            float32): results are compared at that precision (`host`).
    """

    treedef: Any
    fixed: dict[int, Any]
    traced: tuple[int, ...]
    starts: tuple[int, ...]
    signature: str
    floor: str | None = None

    @classmethod
    def of(
        cls,
        key: Any,
        leaves: list[Any],
        treedef: Any,
        shown: Sequence[Any],
        names: dict[str, int] | None = None,
    ) -> Layout:
        """The layout of a call.

        Args:
            key: the signature's key, from `call_key`.
            leaves: the call's leaves, from `call_key`.
            treedef: the call's structure, from `call_key`.
            shown: the parts of the arguments the signature's text describes.
            names: signature text -> hash of its key, of the texts one accelerated function
                or module gave so far (updated): a text another key holds gets a suffix.
        """
        args, _ = jax.tree_util.tree_unflatten(treedef, leaves)
        starts = [0]
        for arg in args:
            starts.append(starts[-1] + len(jax.tree_util.tree_leaves(arg)))
        fixed = {
            i: leaf
            for i, leaf in enumerate(leaves)
            if not isinstance(leaf, (jax.Array, np.ndarray, np.generic))
            and type(leaf) not in NUMBERS
        }
        places = sorted({_place(x) for x in leaves if isinstance(x, jax.Array)})
        where = places[0] if len(places) == 1 else f"{len(places)} placements" if places else "host"
        # An address in a repr (an object's default one) would make every run's signature,
        # and so its decision-cache key, new: the digest leaves addresses out.
        digest = hashlib.sha256(_ADDRESS.sub(" at 0x?", repr(key)).encode()).hexdigest()[:8]
        text = f"({', '.join(_describe(part) for part in shown)}) on {where} #{digest}"
        if names is not None:
            # The text names the runner: two keys with one text (fixed leaves that differ but
            # print alike) must not share it, or the second would run the first's constants.
            # The key's hash stands for it (holding keys would hold every fixed object); a
            # jit runner's fixed objects stay alive in it, so their id-hashes are not reused.
            base, n, mark = text, 1, hash(key)
            while names.setdefault(text, mark) != mark:
                n += 1
                text = f"{base}~{n}"
        traced = tuple(i for i in range(len(leaves)) if i not in fixed)
        return cls(treedef, fixed, traced, tuple(starts), text, _floor(leaves))

    def flat(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` as a function of the traced leaves only, the fixed ones closed over."""
        count = len(self.fixed) + len(self.traced)

        def flat(*traced: Any) -> Any:
            it = iter(traced)
            leaves = [self.fixed[i] if i in self.fixed else next(it) for i in range(count)]
            args, kwargs = jax.tree_util.tree_unflatten(self.treedef, leaves)
            return fn(*args, **kwargs)

        return flat

    def traced_leaves(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        """The leaves of a call of this layout that are traced (the fixed ones left out)."""
        leaves = jax.tree_util.tree_leaves((tuple(args), kwargs))
        return [leaves[i] for i in self.traced]

    def leaf_positions(self, argnums: Sequence[int]) -> tuple[int, ...]:
        """Positions among the traced leaves of the leaves of positional arguments `argnums`."""
        wanted = {i for n in argnums for i in range(self.starts[n], self.starts[n + 1])}
        return tuple(p for p, i in enumerate(self.traced) if i in wanted)


def eps(dtype: Any) -> float:
    """The machine epsilon of a floating dtype (bfloat16 included)."""
    return float(jnp.finfo(dtype).eps)


def _floor(leaves: Sequence[Any]) -> str | None:
    # bfloat16 parameters feeding a float32 output (BatchNorm statistics, a float32 loss)
    # compute at bfloat16's precision: a float32 tolerance would reject every compiled rung.
    dtypes = {
        np.dtype(x.dtype)
        for x in leaves
        if isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.floating)
    }
    low = max(dtypes, key=eps, default=None)
    return None if low is None or eps(low) <= eps(np.float32) else low.name


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def platform_parts() -> dict[str, Any]:
    """What a decision depends on in the platform: versions, device kind, x64."""
    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "optax": _version("optax"),
        "platform": device.platform,
        "device_kind": device.device_kind,
        "x64": bool(jax.config.read("jax_enable_x64")),
    }


def _crafts(craft: Craft) -> list[str]:
    # The code of every Craft's `run` in the tree: a changed run() is another model.
    found: list[str] = []

    def walk(part: Any) -> None:
        if isinstance(part, Craft):
            found.append(f"{type(part).__qualname__}:{code_digest(type(part).run)}")
            for child in part.parts().values():
                walk(child)
        elif isinstance(part, (list, tuple)):
            for child in part:
                walk(child)
        elif isinstance(part, dict):
            for child in part.values():
                walk(child)

    walk(craft)
    return found


def module_parts(shell: JaxModule) -> dict[str, Any]:
    """What a module's decisions depend on besides the signature: structure, code, versions."""
    craft = shell.craft
    return {
        "kind": "module",
        "craft": f"{type(craft).__module__}.{type(craft).__qualname__}",
        "code": _crafts(craft),
        "layers": [(name, repr(layer)) for name, layer in craft.named_layers()],
        "module": f"{type(shell).__qualname__}{getattr(shell, 'topk', '')}",
        **platform_parts(),
    }
