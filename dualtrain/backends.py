"""The registry, and finding a framework from the arrays in hand.

The contract an adapter implements, `Backend` and its `BackendTraits` defaults, lives in
`dualtrain.backend_contract` and is re-exported here.

dualtrain never imports a framework on its own. `backend_of(x)` looks the type of `x` up
among the modules already in ``sys.modules`` (a torch tensor in hand means torch is already
imported), caches the answer per type, and only then loads the matching adapter. The other
way to name a backend is explicit: ``load("torch" | "jax" | "numpy" | "cupy")``. There is no
global switch, so torch and JAX live side by side in one process.

This module is the one door from the core to an adapter: it imports adapters by name
(`importlib`), and only when a caller asked for that backend. Each other module of an
adapter that the core uses is a *part* (`load_part`), listed in `PARTS` with the Protocol it
meets; the Protocols live beside the core modules that use them (``dualtrain/*/seams.py``),
each with its typed accessor (``fuel.seams.data_part(name)``). A part may declare its
framework's policy as data (``TRAITS``), which `traits` reads without loading the framework.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any, cast

from dualtrain.backend_contract import Backend, BackendTraits
from dualtrain.errors import BackendError, bad_argument

__all__ = [
    "FRAMEWORKS",
    "Declared",
    "NAMES",
    "PARTS",
    "Backend",
    "BackendTraits",
    "available",
    "backend_of",
    "load",
    "load_part",
    "policy",
    "seam",
    "traits",
]

NAMES = ("numpy", "torch", "jax", "cupy")
# The backends with an adapter package of their own (parts, declared policy).
FRAMEWORKS = ("torch", "jax")

# Array types of each framework, as (module, attribute) pairs looked up in sys.modules.
# JAX tracers are listed so that dispatch also works inside jit, grad and vmap.
_ARRAY_TYPES: dict[str, tuple[tuple[str, str], ...]] = {
    "numpy": (("numpy", "ndarray"), ("numpy", "generic")),
    "torch": (("torch", "Tensor"),),
    "jax": (("jax", "Array"), ("jax.core", "Tracer")),
    "cupy": (("cupy", "ndarray"),),
}

# Where each backend's implementation lives. The core's own (NumPy) and the CuPy one,
# which receives the cupy module rather than importing it, sit in the core package.
_ADAPTERS = {
    "numpy": "dualtrain.numpy_backend",
    "torch": "dualtrain_torch.backend",
    "jax": "dualtrain_jax.backend",
    "cupy": "dualtrain.cupy_backend",
}

# The parts of an adapter the core uses (``dualtrain_<name>.<part>``) and, per adapter, the
# Protocol its module meets, as "module:Protocol" (names, not imports: the seams' modules
# import this one). `load_part` refuses a part not listed, so none is reached untyped, and
# tests/test_seams.py checks each adapter's module against its Protocol.
_CHECKPOINT = "dualtrain.checkpoint.seams:"
_EMBEDDINGS = "dualtrain.embeddings.seams:"
PARTS: dict[str, dict[str, str]] = {
    "layers": dict.fromkeys(("torch", "jax"), "dualtrain.craft.seams:LayersPart"),
    "craft": dict.fromkeys(("torch", "jax"), "dualtrain.craft.seams:CraftPart"),
    "checkpoint": {
        "torch": _CHECKPOINT + "TorchCheckpointPart",
        "jax": _CHECKPOINT + "CheckpointPart",
    },
    "data": dict.fromkeys(("torch", "jax"), "dualtrain.fuel.seams:DataPart"),
    "embeddings": {
        "torch": _EMBEDDINGS + "TorchEmbeddingsPart",
        "jax": _EMBEDDINGS + "EmbeddingsPart",
    },
    "demo": dict.fromkeys(("torch", "jax"), "dualtrain.demo.seams:DemoPart"),
    "preload": dict.fromkeys(("torch", "jax"), "dualtrain.preload.seams:PreloadPart"),
    "distributed": dict.fromkeys(("torch", "jax"), "dualtrain.multiverse.seams:DistributedPart"),
    "cockpit": dict.fromkeys(("torch", "jax"), "dualtrain.cockpit.seams:CockpitPart"),
}


_lock = threading.Lock()
_instances: dict[str, Backend] = {}
_type_cache: dict[type, str | None] = {}
_backend_cache: dict[type, Backend] = {}
_SCALARS = (bool, int, float, complex, type(None))


def load(name: str) -> Backend:
    """The backend called `name`, importing its adapter (and framework) on first use.

    Args:
        name: one of ``"numpy"``, ``"torch"``, ``"jax"``, ``"cupy"``.

    Raises:
        ValueError: for an unknown name.
        ImportError: when the framework is not installed (with the extra to install).
    """
    backend = _instances.get(name)
    if backend is not None:
        return backend
    if name not in _ADAPTERS:
        raise bad_argument("backend", name, "one of " + ", ".join(map(repr, NAMES)))
    with _lock:
        if name not in _instances:
            module = _import_adapter(name)
            _instances[name] = module.make_backend()
    return _instances[name]


def load_part(name: str, part: str) -> Any:
    """The module `part` of backend `name`'s adapter (``load_part("torch", "demo")``).

    Untyped here, so this registry imports none of its consumers' contracts: each seam
    module has a typed accessor (``fuel.seams.data_part(name) -> DataPart``) returning the
    module as the Protocol `PARTS` names for it (`seam`), which the module meets.

    Raises:
        ArgumentError: for a backend other than torch or JAX, or a part not in `PARTS`.
    """
    _check_part(name, part)
    load(name)
    return importlib.import_module(f"dualtrain_{name}.{part}")


def traits(name: str, part: str) -> Any:
    """What backend `name`'s module `part` declares as ``TRAITS``, its framework not imported.

    Such a part imports its framework only when another of its names is first used.

    Raises:
        ArgumentError: for a backend other than torch or JAX, or a part not in `PARTS`.
    """
    _check_part(name, part)
    return importlib.import_module(f"dualtrain_{name}.{part}").TRAITS


def policy(name: str) -> Any:
    """Backend `name`'s declared policy (``dualtrain_<name>.policy``), its framework not imported.

    What differs between frameworks is the adapter's to say, as data: the core reads the
    compile ladder's rungs (``LADDER``) and model batching's strategies (``STRATEGIES``)
    here instead of asking which framework it runs on.

    Raises:
        ArgumentError: for a backend other than torch or JAX.
    """
    if name not in FRAMEWORKS:
        raise bad_argument("backend", name, "'torch' or 'jax'")
    return importlib.import_module(f"dualtrain_{name}.policy")


class Declared(Mapping[str, Any]):
    """framework name -> what its adapter's policy declares as `name` (or its `field`).

    Read on first use: a table by framework that the core holds without naming one.
    """

    def __init__(self, name: str, field: str | None = None) -> None:
        self.name, self.field = name, field

    def __getitem__(self, framework: str) -> Any:
        if framework not in FRAMEWORKS:
            raise KeyError(framework)
        value = getattr(policy(framework), self.name)
        return value if self.field is None else getattr(value, self.field)

    def __iter__(self) -> Iterator[str]:
        return iter(FRAMEWORKS)

    def __len__(self) -> int:
        return len(FRAMEWORKS)

    def __repr__(self) -> str:
        return repr(dict(self))

    def __or__(self, other: Mapping[str, Any]) -> dict[str, Any]:
        return {**self, **other}

    def __ror__(self, other: Mapping[str, Any]) -> dict[str, Any]:
        return {**other, **self}


def seam(name: str, part: str) -> type:
    """The Protocol that backend `name`'s module `part` meets (imports only the core's seams).

    Raises:
        ArgumentError: for a backend other than torch or JAX, or a part not in `PARTS`.
    """
    _check_part(name, part)
    module, _, protocol = PARTS[part][name].partition(":")
    return cast(type, getattr(importlib.import_module(module), protocol))


def _check_part(name: str, part: str) -> None:
    if name not in FRAMEWORKS:
        raise bad_argument("backend", name, "'torch' or 'jax'")
    if part not in PARTS:
        raise bad_argument("part", part, "one of " + ", ".join(map(repr, PARTS)))


def available() -> list[str]:
    """Names of the backends whose framework is importable right now, without importing."""
    return ["numpy", *(name for name in ("torch", "jax", "cupy") if _installed(name))]


def _installed(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install must not break the caller
        return False


def backend_of(*arrays: Any) -> Backend:
    """The backend that owns `arrays`, found without importing anything.

    Python scalars and None are skipped, as the array API's ``array_namespace`` does.

    Raises:
        BackendError: (a TypeError) when an argument is of no known framework, when arrays
            of several frameworks are mixed, or when no array was given.
    """
    names = {_name_of_type(type(x)) for x in arrays if not isinstance(x, _SCALARS)}
    if None in names:
        bad = next(x for x in arrays if _name_of_type(type(x)) is None)
        raise BackendError(
            f"arrays must be NumPy, torch, JAX or CuPy arrays; got {type(bad).__qualname__}"
        )
    if len(names) != 1:
        if not names:
            raise BackendError("backend_of needs at least one array; got only scalars")
        found = sorted(map(str, names))
        raise BackendError(f"arrays must all belong to one framework; got {found}")
    return load(names.pop())  # type: ignore[arg-type]


def of_type(cls: type) -> Backend | None:
    """The loaded backend owning arrays of type `cls`, or None (cached; for hot paths)."""
    backend = _backend_cache.get(cls)
    if backend is None:
        name = _name_of_type(cls)
        if name is None:
            return None
        backend = _backend_cache[cls] = load(name)
    return backend


def _name_of_type(cls: type) -> str | None:
    try:
        return _type_cache[cls]
    except KeyError:
        pass
    found = None
    for name, specs in _ARRAY_TYPES.items():
        for module_name, attr in specs:
            module = sys.modules.get(module_name)
            base = getattr(module, attr, None) if module is not None else None
            if isinstance(base, type) and issubclass(cls, base):
                found = name
                break
        if found:
            break
    # Negative answers are final too: a framework's array type cannot exist before the
    # framework is imported, and a type that exists now never becomes one of theirs.
    _type_cache[cls] = found
    return found


_HINT = {"torch": "dualtrain[torch]", "jax": "dualtrain[jax]", "cupy": "dualtrain[gpu]"}


def _import_adapter(name: str) -> ModuleType:
    try:
        if name == "cupy":  # the CuPy backend lives in the core and is handed the module
            importlib.import_module("cupy")
        return importlib.import_module(_ADAPTERS[name])
    except ImportError as err:
        missing = getattr(err, "name", None) or name
        raise ImportError(
            f"backend {name!r} needs {missing!r}, which is not installed; "
            f"install it with: pip install '{_HINT.get(name, name)}'"
        ) from err
