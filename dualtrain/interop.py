"""Zero-copy exchange of pytrees of arrays between NumPy, torch, JAX and CuPy.

`convert(tree, to=...)` follows the array API's copy contract and DLPack:

* ``copy=None`` shares memory whenever that is safe and copies only when it must;
* ``copy=True`` always copies;
* ``copy=False`` never copies and raises BufferError when a copy cannot be avoided.

Host arrays are inspected through a zero-copy NumPy view, so every rule (strides, read-only
buffers, alignment, byte order, 64-bit dtypes) lives here once; a foreign DLPack producer or
a raw capsule on the host becomes such a view first. Device arrays go framework to framework
through ``from_dlpack(obj)``, which passes the consumer's stream to the producer: no global
synchronize. Every copy made is counted; see `count_copies`.

Mutability rule: a JAX array is immutable, and so is a read-only NumPy array. NumPy receives
such a buffer as a read-only view and JAX as an array, both zero-copy. Torch and CuPy cannot
mark memory read-only (torch's inference tensors check only after the write has happened),
so under ``copy=None`` they receive a copy. ``copy=False`` shares the buffer anyway: that is
the caller's promise never to write through the tensor. The other way round, a JAX array
made from a torch tensor or NumPy array without a copy borrows that memory: do not write the
source while the JAX array is in use, or convert with ``copy=True``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from dualtrain import backends
from dualtrain.dlpack_inputs import (
    CAPSULE,
    CARRIES,
    HOST_DEVICES,
    NOT_FOREIGN,
    Capsule,
    Producer,
    foreign_kind,
    numpy_import,
    refusal,
    writable,
)
from dualtrain.errors import ArgumentError, DtypeError, PrecisionWarning, bad_argument
from dualtrain.layout import (
    CARRIED,
    NARROWER,
    canonical_strides,
    copy_reason,
    describe_dtype,
    describe_layout,
    dtypes_named,
)
from dualtrain.memory import aligned_empty
from dualtrain.tree import Path, format_path, map_with_path

__all__ = ["CopyCount", "convert", "count_copies", "record_copy"]

_plans: dict[tuple[Any, ...], _Plan] = {}

_NARROW_POLICIES = ("warn", "error", "allow")


@dataclasses.dataclass
class CopyCount:
    """Copies made by `convert` calls inside a `count_copies` block.

    Attributes:
        copies: number of arrays copied.
        nbytes: bytes copied, in total.
    """

    copies: int = 0
    nbytes: int = 0


_counters: contextvars.ContextVar[tuple[CopyCount, ...]] = contextvars.ContextVar(
    "dualtrain_copy_counters", default=()
)


@contextlib.contextmanager
def count_copies() -> Iterator[CopyCount]:
    """Counts the copies `convert` (and the adapters' roads) make in this block.

    Nested blocks all count; copies are counted in the thread (context) that makes them.

    Example:
        >>> with count_copies() as c:
        ...     t = convert(batch, to="torch")
        >>> c.copies, c.nbytes
    """
    count = CopyCount()
    token = _counters.set((*_counters.get(), count))
    try:
        yield count
    finally:
        _counters.reset(token)


def record_copy(nbytes: int) -> None:
    """Counts one copy of `nbytes` bytes in every open `count_copies` block.

    For an adapter's road that copies outside `convert` (the JAX Tank courier copies small
    batches itself), so that `count_copies` still sees every copy a batch takes.
    """
    for count in _counters.get():
        count.copies += 1
        count.nbytes += int(nbytes)


def convert(
    tree: Any,
    to: str,
    *,
    copy: bool | None = None,
    device: Any = None,
    narrow: str = "warn",
) -> Any:
    """Converts every array in `tree` to framework `to`, sharing memory where it can.

    Args:
        tree: an array, or a pytree (dict, list, tuple, namedtuple, dataclass) of arrays.
            Array leaves are NumPy, torch, JAX or CuPy arrays, any object with
            ``__dlpack__`` and ``__dlpack_device__``, or a raw DLPack capsule, which is
            consumed (it can be imported once). Other leaves (numbers, strings, None) come
            back unchanged.
        to: ``"numpy"``, ``"torch"``, ``"jax"`` or ``"cupy"``.
        copy: None shares memory where safe; True always copies; False never copies and
            raises BufferError when it would have to.
        device: where the results should live (``"cpu"``, ``"cuda:0"``, a torch or JAX
            device); None keeps each array where it is.
        narrow: what to do when JAX runs without x64 and a leaf is 64-bit: float64 and
            complex128 become 32-bit with a PrecisionWarning (``"warn"``), silently
            (``"allow"``) or not at all (``"error"``, DtypeError). Integers narrow only when
            every value fits; otherwise DtypeError.

    Returns:
        The same pytree with arrays of framework `to`. Autograd history is not carried.

    Raises:
        BufferError: ``copy=False`` and a copy was unavoidable (the message says why).
        DtypeError: a 64-bit leaf cannot be narrowed for JAX without losing values, or a
            leaf's dtype or kind is not carried (float8, complex32, str, object, sparse...).
        ArgumentError: (a ValueError) an unknown `to`, `copy`, `narrow` or `device`, a cyclic
            `tree`, a used DLPack capsule. Messages name the leaf's path where there is one.
    """
    # Plans are cached per argument set: the checks run once, not on every call.
    key = (to, copy, type(copy), narrow)
    try:
        plan = _plans.get(key) if device is None else None
    except TypeError:  # an unhashable argument: _Plan says which, in the house form
        plan = None
    if plan is None:
        plan = _Plan(to, copy, device, narrow)
        if device is None:
            _plans[key] = plan
    return map_with_path(plan.leaf, tree)


class _Plan:
    """How one `convert` call treats each leaf; its `leaf` method is the hot path."""

    __slots__ = ("copy", "device", "dst", "fast", "narrow", "special")

    def __init__(self, to: Any, copy: Any, device: Any, narrow: Any) -> None:
        if copy is not None and copy is not True and copy is not False:
            raise bad_argument("copy", copy, "None, True or False")
        if narrow not in _NARROW_POLICIES:
            raise bad_argument("narrow", narrow, "'warn', 'error' or 'allow'")
        if not isinstance(to, str) or to not in backends.NAMES:
            raise bad_argument("to", to, "one of 'numpy', 'torch', 'jax', 'cupy'")
        self.dst = backends.load(to)
        # Checked once, before any leaf is touched (a capsule can be consumed only once).
        self.device = None if device is None else self.dst.parse_device(device)
        self.copy, self.narrow = copy, narrow
        self.special = dtypes_named(self.dst.import_copies)
        # Host dtypes that can take the fast path: carried, imported as they are, never narrowed.
        self.fast = CARRIED - self.special - NARROWER.keys()

    def leaf(self, path: Path, x: Any) -> Any:
        src = backends.of_type(type(x))
        if src is None:
            kind = foreign_kind(type(x))
            if kind == NOT_FOREIGN:
                return x
            return self.leaf(path, self._import_foreign(path, x, kind))
        dst = self.dst
        if src is dst:
            y = x
            if self.copy:
                y = dst.copy(x)
                record_copy(_nbytes(x))
        elif src.on_host(x):
            y = self._fast_from_host(path, src, x)
        else:
            y = self._from_device(path, src, x)
        if self.device is None:
            return y
        return self._place(path, y)

    def _fast_from_host(self, path: Path, src: Any, x: Any) -> Any:
        """The common case in a few checks; anything unusual goes to `_from_host`."""
        try:
            a = src.to_numpy(x)
        except BufferError as err:  # a lazy view (torch conj/neg): its values are not in memory
            self._allow_copy(path, str(err))
            x = src.exportable(x)
            record_copy(_nbytes(x))
            a = src.to_numpy(x)
        except (TypeError, RuntimeError, ValueError) as err:  # no NumPy view of this kind
            what = src.unsupported(x)
            if what is None:
                raise
            raise refusal(path, what, self.dst.name) from err
        dst = self.dst
        flags, dtype = a.flags, a.dtype
        readonly = src.immutable or not flags.writeable
        if (
            self.copy is not True
            and not dst.device_only
            and flags.c_contiguous
            and (not readonly or (dst.marks_readonly and dst.takes_readonly_host))
            and dtype in self.fast
            and (dst.host_alignment == 1 or not _small_and_unaligned(a, dst.host_alignment))
            and not (src.may_copy_silently and a.size and not src.shares(x, a))
        ):
            try:
                return dst.from_numpy(a, readonly=readonly)
            except (ValueError, BufferError, RuntimeError):
                pass  # misaligned for JAX, a negative stride on a size-1 axis for torch, ...
        return self._from_host(path, src, x, a)

    def _from_host(self, path: Path, src: Any, x: Any, a: np.ndarray) -> Any:
        dst, swapped = self.dst, False
        a = canonical_strides(a)  # strides no element uses must not make a framework refuse
        if a.dtype not in CARRIED:
            a, swapped = self._native(path, src, x, a), True
        if dst.device_only:  # host -> GPU is a transfer whatever the layout
            self._allow_copy(path, f"{dst.name} arrays live on the GPU, this one in host memory")
            record_copy(a.nbytes)
            return dst.from_numpy(a, readonly=False)
        if src.may_copy_silently and a.size and not src.shares(x, a):
            self._allow_copy(path, f"its {src.name} layout is not row-major")
            record_copy(a.nbytes)
        readonly = src.immutable or not a.flags.writeable
        reason = None if not self.copy or swapped else "copy=True"  # swapped: copied already
        fresh = None
        target_dtype = self._narrowed_dtype(path, a)
        if target_dtype is not None:
            reason = f"{dst.name} without x64 cannot hold {a.dtype}"
        elif reason is None:
            reason = copy_reason(a, dst)
        if reason is None and readonly and not dst.marks_readonly and self.copy is not False:
            reason = f"{dst.name} cannot mark memory read-only, and the source must not change"
        if reason is None:
            if a.dtype in self.special:
                if src.name != "numpy":  # NumPy cannot carry it over DLPack; frameworks can
                    return dst.from_dlpack(src.exportable(x), copy=False)
                self._allow_copy(path, f"{dst.name} copies {a.dtype} arrays from NumPy")
                record_copy(a.nbytes)
                return dst.from_numpy(a, readonly=readonly)
            return self._import(path, a, readonly)
        self._allow_copy(path, reason)
        if target_dtype is not None:
            fresh = aligned_empty(a.shape, target_dtype)
            np.copyto(fresh, a, casting="unsafe")
            a = fresh  # narrowed: this was the copy; import it as it is
        record_copy(a.nbytes)
        if a.dtype in self.special:  # the import copies again (bfloat16 into JAX)
            record_copy(a.nbytes)
        return dst.from_numpy(a, readonly=False) if a is fresh else dst.from_numpy_copy(a)

    def _native(self, path: Path, src: Any, x: Any, a: np.ndarray) -> np.ndarray:
        """A byte-swapped array in native byte order (one counted copy); other dtypes refused."""
        native = a.dtype.newbyteorder("=")
        if native not in CARRIED or native == a.dtype:
            raise refusal(path, src.unsupported(x) or describe_dtype(a.dtype), self.dst.name)
        # No framework but NumPy holds a foreign byte order; the values survive a swap.
        self._allow_copy(path, f"its byte order is not native ({a.dtype.str!r})")
        fresh = aligned_empty(a.shape, native)
        np.copyto(fresh, a)
        record_copy(a.nbytes)
        return fresh

    def _import(self, path: Path, a: np.ndarray, readonly: bool) -> Any:
        try:
            y = self.dst.from_numpy(a, readonly=readonly)
        except (ValueError, TypeError, BufferError, RuntimeError) as err:
            # A layout the checks above did not foresee: copy it rather than leak the
            # framework's own error (refused, naming the layout, under copy=False).
            self._allow_copy(
                path, f"{self.dst.name} refused its layout ({describe_layout(a)}: {err})"
            )
            record_copy(a.nbytes)
            return self.dst.from_numpy_copy(a)
        if self.dst.may_copy_silently and a.size and self.dst.data_address(y) != a.ctypes.data:
            self._allow_copy(path, f"{self.dst.name} would not share this layout")
            record_copy(a.nbytes)
        return y

    def _from_device(self, path: Path, src: Any, x: Any) -> Any:
        dst, where = self.dst, src.device_of(x)
        what = src.unsupported(x)
        if what is not None:
            raise refusal(path, what, dst.name)
        view = src.lazy_view(x)
        if view is not None:  # resolving it writes new memory
            self._allow_copy(path, view)
            x = src.exportable(x)
            record_copy(_nbytes(x))
        if dst.name == "numpy" or where.startswith("sharded:"):
            # No single device buffer to share: gather into host memory, then go on from there.
            self._allow_copy(path, f"the array lives on {where}, not in one host buffer")
            a = src.to_host(x)
            record_copy(a.nbytes)
            if dst.name == "numpy":
                return a
            return self._fast_from_host(path, backends.load("numpy"), a)
        x = src.exportable(x)
        if not src.is_contiguous(x):  # negative or gapped strides abort some importers
            self._allow_copy(path, "its strides are not contiguous")
            x = src.copy(x)
            record_copy(_nbytes(x))
        name = _dtype_name(x)
        dtype = None if name == "bfloat16" else np.dtype(name)
        if dtype in NARROWER and not dst.supports_x64():
            self._check_narrowing(path, dtype, on_device=True)
            self._allow_copy(path, f"{dst.name} without x64 cannot hold {dtype}")
            record_copy(_nbytes(x) // 2)
        elif self.copy or (src.immutable and not dst.marks_readonly and self.copy is None):
            record_copy(_nbytes(x))
            return dst.from_dlpack(x, copy=True)
        return dst.from_dlpack(x, copy=self.copy, readonly=src.immutable)

    def _place(self, path: Path, y: Any) -> Any:
        if self.dst.same_device(y, self.device):
            return y
        self._allow_copy(path, f"it must move to device {self.device!r}")
        try:
            moved = self.dst.device_put(y, self.device)
        except (RuntimeError, ValueError) as err:  # out of memory there, a driver error
            raise ArgumentError(
                f"{format_path(path)} could not be moved to device={self.device!r}: {err}"
            ) from err
        record_copy(_nbytes(y))
        return moved

    def _allow_copy(self, path: Path, reason: str) -> None:
        if self.copy is False:
            raise BufferError(
                f"copy=False, but {format_path(path)} cannot be converted to "
                f"{self.dst.name} without a copy: {reason}"
            )

    def _narrowed_dtype(self, path: Path, a: np.ndarray) -> np.dtype | None:
        narrower = NARROWER.get(a.dtype)
        if narrower is None or self.dst.supports_x64():
            return None
        if a.dtype.kind in "iu":
            info = np.iinfo(narrower.type)
            if a.size and (a.min() < info.min or a.max() > info.max):
                raise DtypeError(
                    f"{format_path(path)} is {a.dtype} with values in [{a.min()}, {a.max()}], "
                    f"which do not fit {narrower}; {self.dst.name} runs without x64. "
                    "Enable it with jax.config.update('jax_enable_x64', True)"
                )
            return narrower
        self._check_narrowing(path, a.dtype, on_device=False)
        return narrower

    def _check_narrowing(self, path: Path, dtype: np.dtype, *, on_device: bool) -> None:
        where = format_path(path)
        if on_device and dtype.kind in "iu" and self.narrow != "allow":
            raise DtypeError(
                f"{where} is a device array of {dtype}; {self.dst.name} runs without x64 and "
                "its values cannot be checked in place. Pass narrow='allow' or cast it first"
            )
        message = (
            f"{where} is {dtype}, but {self.dst.name} runs without x64: it becomes "
            f"{NARROWER[dtype]}. Pass narrow='allow' to accept this silently, or enable x64"
        )
        if self.narrow == "error":
            raise DtypeError(message)
        if self.narrow == "warn" and dtype.kind in "fc":
            warnings.warn(message, PrecisionWarning, stacklevel=2)

    # ---- foreign producers: the rest is in dualtrain.dlpack_inputs -------------------------

    def _take(self, path: Path, x: Any, importer: Any) -> Any:
        try:
            return importer(x, copy=False)
        except TypeError:  # a producer older than DLPack 1.0's keywords; those never copy
            return importer(x, copy=None)
        except BufferError as err:  # it cannot share (a torch conjugate view): ask for a copy
            self._allow_copy(path, f"its producer would not export it without a copy ({err})")
        try:
            y = importer(x, copy=True)
        except (BufferError, TypeError) as err:
            raise BufferError(
                f"{format_path(path)} cannot be converted to {self.dst.name}: its producer "
                f"would not export it ({err})"
            ) from err
        record_copy(_nbytes(y))
        return y

    # foreign producers and raw DLPack capsules (`dualtrain.dlpack_inputs`)
    def _import_foreign(self, path: Path, x: Any, kind: int) -> Any:
        """`x` imported without a copy into NumPy (host) or `to` (device), to go on from there.

        Copies happen only where the producer refuses to share (counted, refused under
        ``copy=False``); a device array bound for NumPy is imported by a framework in use and
        gathered from there, like that framework's own arrays.
        """
        x = Capsule(path, x) if kind == CAPSULE else Producer(x)
        try:
            device = tuple(x.__dlpack_device__())
        except Exception as err:  # a producer's own failure, whatever its type
            raise ArgumentError(
                f"{format_path(path)} has __dlpack__ but its __dlpack_device__() failed: {err!r}"
            ) from err
        if device[0] in HOST_DEVICES:
            try:
                a = self._take(path, x, numpy_import)
            except (RuntimeError, ValueError) as err:  # a dtype NumPy cannot import (bfloat16)
                return self._via_framework(path, x, f"NumPy cannot import it ({err})")
            # An unversioned capsule has no read-only flag, so NumPy marks its array read-only.
            # The DLPack spec forbids exporting read-only memory that way: it is writable,
            # as torch.from_dlpack takes it.
            return writable(a) if x.legacy and not a.flags.writeable else a
        if self.dst.name == "numpy":  # through a framework, whose gather to host is counted
            where = f"it lives on DLPack device {device}"
            return self._via_framework(path, x, where, BufferError)
        return self._checked(path, self.dst, self._take(path, x, self.dst.from_dlpack))

    def _via_framework(
        self, path: Path, x: Any, why: str, error: type[Exception] = DtypeError
    ) -> Any:
        """A producer NumPy cannot take (bfloat16, float8, device memory), via a framework in use.

        JAX goes first where it is loaded: torch.from_dlpack aborts the process on negative
        strides, while JAX refuses them with an error.
        """
        names = ["jax", "torch"] if self.dst.name == "numpy" else [self.dst.name, "jax", "torch"]
        for name in dict.fromkeys(names):
            if name != self.dst.name and sys.modules.get(name) is None:
                continue
            backend = backends.load(name)
            try:
                y = self._take(path, x, backend.from_dlpack)
            except BufferError:
                raise
            except Exception:  # each framework refuses in its own way; the next may take it
                continue
            return self._checked(path, backend, y)
        raise error(
            f"{format_path(path)} is a DLPack export that no framework in use could import "
            f"({why}); {CARRIES}"
        )

    def _checked(self, path: Path, backend: Any, y: Any) -> Any:
        what = backend.unsupported(y)
        if what is not None:
            raise refusal(path, f"a DLPack export that arrives as {what}", self.dst.name)
        return y


# A refused zero-copy import into JAX costs ~25 µs and reading an address 1.5 µs (measured):
# small arrays, which would then be copied in ~20 µs, have their alignment checked up front;
# large ones try the import first, since their copy takes milliseconds anyway.
_CHECK_FIRST_BYTES = 256 * 1024


def _small_and_unaligned(a: np.ndarray, alignment: int) -> bool:
    return 0 < a.nbytes <= _CHECK_FIRST_BYTES and a.ctypes.data % alignment != 0


def _nbytes(x: Any) -> int:
    nbytes = getattr(x, "nbytes", None)
    if nbytes is None:  # torch tensors
        nbytes = x.element_size() * x.numel()
    return int(nbytes)


def _dtype_name(x: Any) -> str:
    return str(x.dtype).removeprefix("torch.")
