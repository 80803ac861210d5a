"""The Backend contract, the registry, and finding a framework from the arrays in hand.

dualtrain never imports a framework on its own. `backend_of(x)` looks the type of `x` up
among the modules already in ``sys.modules`` (a torch tensor in hand means torch is already
imported), caches the answer per type, and only then loads the matching adapter. The other
way to name a backend is explicit: ``load("torch" | "jax" | "numpy" | "cupy")``. There is no
global switch, so torch and JAX live side by side in one process.

This module is the one door from the core to an adapter: it imports adapters by name
(`importlib`), and only when a caller asked for that backend. Each other module of an
adapter that the core uses is a *part* (`load_part`), listed in `PARTS` with the Protocol it
meets; the Protocols live beside the core modules that use them (``dualtrain/*/seams.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, overload, runtime_checkable

from dualtrain.errors import BackendError, bad_argument
from dualtrain.layout import CARRIED_NAMES

if TYPE_CHECKING:  # the seams sit beside their consumers, which import this module
    from dualtrain.checkpoint.seams import CheckpointPart, TorchCheckpointPart
    from dualtrain.craft.seams import CraftPart, LayersPart
    from dualtrain.demo.seams import DemoPart
    from dualtrain.embeddings.seams import EmbeddingsPart, TorchEmbeddingsPart
    from dualtrain.fuel.seams import DataPart

__all__ = [
    "NAMES",
    "PARTS",
    "Backend",
    "BackendTraits",
    "available",
    "backend_of",
    "load",
    "load_part",
    "seam",
]

NAMES = ("numpy", "torch", "jax", "cupy")

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
# tests/core/test_seams.py checks each adapter's module against its Protocol.
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
}


@runtime_checkable
class Backend(Protocol):
    """What an adapter provides: the framework verbs dualtrain's shared logic is built on.

    Arrays are the framework's own (``torch.Tensor``, ``jax.Array``, ``np.ndarray``). Devices
    are named as strings, ``"cpu"`` or ``"cuda:0"``, whatever the framework calls them.
    Implementations are one-liners; this docstring is their documentation.

    Attributes:
        name: ``"numpy"``, ``"torch"``, ``"jax"`` or ``"cupy"``.
        immutable: arrays cannot be written in place (JAX). A zero-copy alias of such an
            array must be protected from writes by whoever receives it.
        compact_only: zero-copy import refuses non-compact strides (``a[:, ::2]``).
        host_alignment: byte alignment a host buffer needs for a zero-copy import (1: any).
        marks_readonly: arrays can refuse writes (NumPy's read-only flag; JAX is immutable).
            Torch and CuPy cannot, so an immutable source reaches them as a copy unless the
            caller passes ``copy=False`` and promises not to write.
        takes_readonly_host: `from_numpy` accepts a read-only ndarray without a copy.
        import_copies: dtype names that `from_numpy` can only import by copying.
        may_copy_silently: `to_numpy` or `from_numpy` can copy without saying so (JAX does
            for non-row-major layouts); the core then compares `data_address` to know.
        device_only: arrays never live in host memory (CuPy): `from_numpy` is a transfer.
    """

    name: str
    immutable: bool
    compact_only: bool
    host_alignment: int
    marks_readonly: bool
    takes_readonly_host: bool
    import_copies: frozenset[str]
    may_copy_silently: bool
    device_only: bool

    def owns(self, x: Any) -> bool:
        """Whether `x` is an array (or tracer) of this framework."""

    def on_host(self, x: Any) -> bool:
        """Whether `x` lives in one buffer of plain host memory (the fast check)."""

    def shares(self, x: Any, a: Any) -> bool:
        """Whether `a`, returned by ``to_numpy(x)``, shares the memory of `x`."""

    def device_of(self, x: Any) -> str:
        """The device holding `x`: ``"cpu"`` for host memory, else e.g. ``"cuda:0"``."""

    def to_numpy(self, x: Any) -> Any:
        """A zero-copy NumPy view of host array `x` (read-only for immutable frameworks).

        Raises BufferError when `x` is not in plain host memory or cannot be viewed without a
        copy (a lazy view, see `lazy_view`; ``exportable(x)`` can be viewed), and TypeError
        or RuntimeError for what `unsupported` names.
        """

    def unsupported(self, x: Any) -> str | None:
        """What `x` is when `convert` cannot carry it (``"a torch sparse_coo tensor"``), else None.

        Carried: dense arrays of the dtypes in `dualtrain.layout.CARRIED_NAMES`.
        """

    def lazy_view(self, x: Any) -> str | None:
        """Why `x` holds no values in memory (torch's conjugate and negative views), or None."""

    def parse_device(self, device: Any) -> Any:
        """`device` as this framework names it, checked to exist here.

        Raises ArgumentError naming `device` and the devices there are.
        """

    def data_address(self, x: Any) -> int:
        """The address of the first element of `x` in memory."""

    def to_host(self, x: Any) -> Any:
        """A NumPy copy of `x` wherever it lives (device or sharded arrays)."""

    def exportable(self, x: Any) -> Any:
        """`x` ready for DLPack export: detached from autograd, conjugation resolved."""

    def is_contiguous(self, x: Any) -> bool:
        """Whether `x` is C-contiguous (no negative or gapped strides)."""

    def from_numpy(self, a: Any, *, readonly: bool) -> Any:
        """A zero-copy array of this framework over host ndarray `a`.

        `a` already meets `compact_only` and `host_alignment`. `readonly` says that `a` must
        not be written: the result refuses writes where the framework `marks_readonly`.
        """

    def from_numpy_copy(self, a: Any) -> Any:
        """A new array of this framework holding a copy of host array `a` (one copy)."""

    def from_dlpack(self, x: Any, *, copy: bool | None, readonly: bool = False) -> Any:
        """Imports any DLPack producer; the framework passes its own stream to `x`.

        `readonly` as in `from_numpy`.
        """

    def device_put(self, x: Any, device: Any) -> Any:
        """`x` on `device` (a copy only when the device differs)."""

    def same_device(self, x: Any, device: Any) -> bool:
        """Whether `x` already lives on `device`."""

    def copy(self, x: Any) -> Any:
        """A fresh copy of `x`, cut from any autograd history."""

    def supports_x64(self) -> bool:
        """Whether 64-bit dtypes are available now (False for JAX without x64 mode)."""

    def zeros(self, shape: tuple[int, ...], dtype: str, device: Any = None) -> Any:
        """A zero-filled array; `dtype` is a NumPy dtype name (``"float32"``, ``"bfloat16"``)."""

    def stack(self, xs: list[Any], axis: int = 0) -> Any:
        """Stacks same-shape arrays along a new axis."""

    def take_rows(self, x: Any, idx: Any) -> Any:
        """``x[idx]`` along axis 0 for an int index array `idx` of this framework."""

    def put_rows(self, x: Any, idx: Any, values: Any) -> Any:
        """`x` with rows `idx` set to `values` (in place where the framework can, else new)."""


class BackendTraits:
    """Defaults for the Backend attributes; an implementation overrides only what differs.

    The defaults describe a mutable framework that shares any host buffer (torch).
    """

    immutable = False
    compact_only = False
    host_alignment = 1
    marks_readonly = False
    takes_readonly_host = True
    import_copies: frozenset[str] = frozenset()
    may_copy_silently = False
    device_only = False

    def unsupported(self, x: Any) -> str | None:
        """The dtype check of `Backend.unsupported`, for frameworks with nothing more to it."""
        name = str(x.dtype).removeprefix("torch.")
        if name in CARRIED_NAMES:
            return None
        framework = getattr(self, "name", "")  # every Backend has one; the traits do not
        return f"a {_DISPLAY.get(framework, framework)} array of dtype {name}"

    def lazy_view(self, x: Any) -> str | None:
        """None: only torch has lazy views."""
        return None

    def from_numpy_copy(self, a: Any) -> Any:
        """A new array of this framework holding a copy of host array `a`: one copy.

        The default copies into a 64-byte aligned buffer and imports that without a copy.
        """
        from dualtrain.memory import aligned_copy  # memory needs nothing from here

        return self.from_numpy(aligned_copy(a), readonly=False)  # type: ignore[attr-defined]


_DISPLAY = {"numpy": "NumPy", "jax": "JAX", "cupy": "CuPy"}
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


@overload
def load_part(name: str, part: Literal["layers"]) -> LayersPart: ...
@overload
def load_part(name: str, part: Literal["craft"]) -> CraftPart: ...
@overload
def load_part(name: Literal["torch"], part: Literal["checkpoint"]) -> TorchCheckpointPart: ...
@overload
def load_part(name: str, part: Literal["checkpoint"]) -> CheckpointPart: ...
@overload
def load_part(name: str, part: Literal["data"]) -> DataPart: ...
@overload
def load_part(name: Literal["torch"], part: Literal["embeddings"]) -> TorchEmbeddingsPart: ...
@overload
def load_part(name: str, part: Literal["embeddings"]) -> EmbeddingsPart: ...
@overload
def load_part(name: str, part: Literal["demo"]) -> DemoPart: ...


def load_part(name: str, part: str) -> Any:
    """The module `part` of backend `name`'s adapter (``load_part("torch", "demo")``).

    Typed as the Protocol `PARTS` names for it (`seam`), which the module meets.

    Raises:
        ArgumentError: for a backend other than torch or JAX, or a part not in `PARTS`.
    """
    _check_part(name, part)
    load(name)
    return importlib.import_module(f"dualtrain_{name}.{part}")


def seam(name: str, part: str) -> type:
    """The Protocol that backend `name`'s module `part` meets (imports only the core's seams).

    Raises:
        ArgumentError: for a backend other than torch or JAX, or a part not in `PARTS`.
    """
    _check_part(name, part)
    module, _, protocol = PARTS[part][name].partition(":")
    return cast(type, getattr(importlib.import_module(module), protocol))


def _check_part(name: str, part: str) -> None:
    if name not in ("torch", "jax"):
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


if TYPE_CHECKING:
    # mypy's half of the seams' check (tests/core/test_seams.py is the runtime half): each
    # adapter module must be assignable to its Protocol in PARTS. Never imported at run time.
    import dualtrain_jax.checkpoint
    import dualtrain_jax.craft
    import dualtrain_jax.data
    import dualtrain_jax.demo
    import dualtrain_jax.embeddings
    import dualtrain_jax.layers
    import dualtrain_torch.checkpoint
    import dualtrain_torch.craft
    import dualtrain_torch.data
    import dualtrain_torch.demo
    import dualtrain_torch.embeddings
    import dualtrain_torch.layers

    _torch_layers: LayersPart = dualtrain_torch.layers
    _jax_layers: LayersPart = dualtrain_jax.layers
    _torch_craft: CraftPart = dualtrain_torch.craft
    _jax_craft: CraftPart = dualtrain_jax.craft
    _torch_checkpoint: TorchCheckpointPart = dualtrain_torch.checkpoint
    _jax_checkpoint: CheckpointPart = dualtrain_jax.checkpoint
    _torch_data: DataPart = dualtrain_torch.data
    _jax_data: DataPart = dualtrain_jax.data
    _torch_embeddings: TorchEmbeddingsPart = dualtrain_torch.embeddings
    _jax_embeddings: EmbeddingsPart = dualtrain_jax.embeddings
    _torch_demo: DemoPart = dualtrain_torch.demo
    _jax_demo: DemoPart = dualtrain_jax.demo
