"""The Backend contract: the framework verbs the core's shared logic is built on.

`Backend` is the Protocol each adapter's backend (and the core's NumPy and CuPy ones) meets;
`BackendTraits` holds the defaults of its attributes, so an implementation states only what
differs. `dualtrain.backends` re-exports both and finds the implementation for an array.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from dualtrain.layout import CARRIED_NAMES

__all__ = ["Backend", "BackendTraits", "display_name"]

_DISPLAY = {"numpy": "NumPy", "jax": "JAX", "cupy": "CuPy"}


def display_name(framework: str) -> str:
    """`framework` as messages spell it (``"jax"`` -> ``"JAX"``; torch's name is its own)."""
    return _DISPLAY.get(framework, framework)


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
        return f"a {display_name(framework)} array of dtype {name}"

    def lazy_view(self, x: Any) -> str | None:
        """None: only torch has lazy views."""
        return None

    def from_numpy_copy(self, a: Any) -> Any:
        """A new array of this framework holding a copy of host array `a`: one copy.

        The default copies into a 64-byte aligned buffer and imports that without a copy.
        """
        from dualtrain.memory import aligned_copy  # memory needs nothing from here

        return self.from_numpy(aligned_copy(a), readonly=False)  # type: ignore[attr-defined]
