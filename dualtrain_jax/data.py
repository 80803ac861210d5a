"""Tank batches as JAX arrays: on the host, or device_put to a device or sharding.

`Courier(device)` is what `dualtrain.fuel.Tank` hands each batch to: the adapter's
`Transfer` (`dualtrain_jax.transfer`), so batches take the same road to the device as every
other host array, with one difference on the host. A Tank's batch arrays are its own (fresh
each batch, never written again), so sharing or copying them is the same to the caller, and
the cheaper is taken: on a CPU-only JAX with no default device set, leaves up to 256 KiB
are copied by JAX (``jnp.asarray``, onto the first CPU device as the import would place them,
uncommitted as ``jnp.asarray`` makes them; counted by `dualtrain.count_copies`), larger
ones imported without a copy. JAX copies
256 KiB in about 25-30 µs where its DLPack import of any size takes 35-40 µs (measured here,
one core; the import wins from about 512 KiB up: 40 µs against 195 µs at 1 MiB). bfloat16
leaves are imported as before (JAX copies them either way).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dualtrain.interop import record_copy
from dualtrain.layout import NARROWER
from dualtrain_jax.backend import OWN_COPY_BYTES
from dualtrain_jax.transfer import Transfer

__all__ = ["Courier"]

# Held by JAX as they are (no narrowing, no bfloat16 import): copied by JAX directly.
_AS_THEY_ARE = frozenset(
    np.dtype(t) for t in ("bool", "int8", "int16", "int32", "uint8", "uint16", "uint32",
                          "float16", "float32", "complex64")
)  # fmt: skip
_WIDE = frozenset(np.dtype(t) for t in ("int64", "uint64", "float64", "complex128"))
_NARROWED_INTS = frozenset(np.dtype(t) for t in ("int64", "uint64"))


class Courier(Transfer):
    """``Courier(device)(batch)``: a Tank's batch on `device` (None: the host).

    Args:
        device: as `Transfer` takes it; None keeps batches in host memory.
    """

    def __call__(self, tree: Any) -> Any:
        if self.device is not None or type(tree) is not dict or not _copies_to_host_cpu():
            return super().__call__(tree)
        if not all(type(v) is np.ndarray for v in tree.values()):
            return super().__call__(tree)
        x64 = bool(jax.config.read("jax_enable_x64"))
        copied = {k: v for k, v in tree.items() if _copied_by_jax(v, x64)}
        rest = {k: v for k, v in tree.items() if k not in copied}
        out = super().__call__(rest) if rest else {}
        for key, x in copied.items():
            if not x64 and x.dtype in _WIDE:
                x = x.astype(NARROWER[x.dtype])  # in range (`_copied_by_jax`): exact
                record_copy(x.nbytes)
            record_copy(x.nbytes)
            # jnp.asarray copies a NumPy array by device_put; jnp.array(copy=True) would run
            # a copy primitive, compiled once per shape (0.2 s in a fresh process).
            out[key] = jnp.asarray(x)
        return {key: out[key] for key in tree}


def _copies_to_host_cpu() -> bool:
    """Whether ``jnp.asarray`` puts a copy where `convert` puts an import: the first CPU.

    True unless a default device is set (``jax.default_device``) or the default backend is
    a GPU. The copy is uncommitted, as ``jnp.asarray`` makes it; the import is committed.
    """
    default = jax.config.jax_default_device  # type: ignore[attr-defined]
    return default is None and jax.default_backend() == "cpu"


def _copied_by_jax(x: np.ndarray, x64: bool) -> bool:
    """Whether JAX copies `x` faster than it imports it, holding it as it is.

    Without x64, a small int64 or uint64 leaf (a Tank's labels) whose values fit 32 bits
    is narrowed and copied too (a DLPack import of its narrowed copy costs 35-40 µs more);
    one whose values do not fit goes the general way, which refuses it, naming it.
    """
    if not 0 < x.nbytes <= OWN_COPY_BYTES:
        return False
    if x.dtype in _AS_THEY_ARE or (x.dtype in _WIDE and x64):
        return True
    if x.dtype not in _NARROWED_INTS:
        return False
    info = np.iinfo(NARROWER[x.dtype])
    return bool(info.min <= x.min() and x.max() <= info.max)
