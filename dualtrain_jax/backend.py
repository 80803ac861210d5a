"""JaxBackend: the Backend protocol in JAX (documented in `dualtrain.backends`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from dualtrain.backends import BackendTraits
from dualtrain_jax import transfer

__all__ = ["JaxBackend", "make_backend"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
OWN_COPY_BYTES = 256 * 1024  # copies up to this size go through jnp.array

# Whether arrays of a sharding live in one host buffer; shardings compare by their devices,
# so this stays as small as the set of device placements in use.
_HOST_SHARDINGS: dict[Any, bool] = {}


class JaxBackend(BackendTraits):
    """The Backend protocol over ``jax.Array`` (tracers included for `owns`)."""

    name = "jax"
    immutable = True
    compact_only = True  # XLA rejects non-compact DLPack strides
    host_alignment = 64  # the CPU client copies any host buffer not on a 64-byte boundary
    marks_readonly = True  # immutable
    takes_readonly_host = False  # jnp.from_dlpack asks NumPy for an unversioned capsule
    import_copies = frozenset({"bfloat16"})  # NumPy's DLPack export refuses ml_dtypes types
    may_copy_silently = True  # np.asarray copies arrays whose layout is not row-major

    def owns(self, x: Any) -> bool:
        return isinstance(x, (jax.Array, jax.core.Tracer))

    def on_host(self, x: jax.Array) -> bool:
        try:
            return _HOST_SHARDINGS[x.sharding]
        except KeyError:
            sharding: Any = x.sharding  # jaxlib types its devices without .platform
            _HOST_SHARDINGS[sharding] = len(sharding.device_set) == 1 and all(
                d.platform == "cpu" for d in sharding.device_set
            )
            return _HOST_SHARDINGS[sharding]
        except AttributeError:  # tracers have no sharding and no buffer
            return False

    def shares(self, x: jax.Array, a: np.ndarray) -> bool:
        # np.asarray hands back a view whose base is JAX's buffer export; a copy (made for
        # arrays whose layout is not row-major) owns its memory and has no base.
        return a.base is not None

    def device_of(self, x: jax.Array) -> str:
        devices = x.devices()
        if len(devices) != 1:  # sharded over several devices: no single host buffer
            return "sharded:" + ",".join(sorted(str(d) for d in devices))
        return _name(next(iter(devices)))

    def to_numpy(self, x: jax.Array) -> np.ndarray:
        return np.asarray(x)  # zero-copy and read-only for a single-device CPU array

    def data_address(self, x: Any) -> int:
        return int(x.unsafe_buffer_pointer())

    def parse_device(self, device: Any) -> Any:
        return transfer.parse_device(device)

    def to_host(self, x: jax.Array) -> np.ndarray:
        return np.array(x)

    def exportable(self, x: jax.Array) -> jax.Array:
        return x

    def is_contiguous(self, x: jax.Array) -> bool:
        return True

    def from_numpy(self, a: np.ndarray, *, readonly: bool) -> jax.Array:
        if a.size == 0:  # no data to share, and an empty array's address may be unaligned
            return jnp.empty(a.shape, a.dtype)
        if a.dtype.char == _BF16.char and a.dtype == _BF16:  # char first: dtype == is slow
            bits = jnp.from_dlpack(a.view(np.uint16), copy=False)
            return jax.lax.bitcast_convert_type(bits, jnp.bfloat16)
        return jnp.from_dlpack(a, copy=False)

    def from_numpy_copy(self, a: np.ndarray) -> jax.Array:
        # Below ~512 KiB JAX's own copy (18-45 µs) beats a DLPack import (~50 µs, measured).
        if a.nbytes <= OWN_COPY_BYTES and a.dtype != _BF16:
            return jnp.array(a, copy=True)
        return super().from_numpy_copy(a)

    def from_dlpack(self, x: Any, *, copy: bool | None, readonly: bool = False) -> jax.Array:
        return jnp.from_dlpack(x, copy=copy)

    def device_put(self, x: jax.Array, device: Any) -> jax.Array:
        return transfer.shared(device).put(x)  # the adapter's one host -> device road

    def same_device(self, x: jax.Array, device: Any) -> bool:
        return device is None or x.devices() == {_device(device)}

    def copy(self, x: jax.Array) -> jax.Array:
        return jnp.array(x, copy=True)

    def supports_x64(self) -> bool:
        return bool(jax.config.read("jax_enable_x64"))

    def zeros(self, shape: tuple[int, ...], dtype: str, device: Any = None) -> jax.Array:
        return jnp.zeros(shape, dtype=dtype, device=None if device is None else _device(device))

    def stack(self, xs: list[jax.Array], axis: int = 0) -> jax.Array:
        return jnp.stack(xs, axis=axis)

    def take_rows(self, x: jax.Array, idx: jax.Array) -> jax.Array:
        return jnp.take(x, idx, axis=0)

    def put_rows(self, x: jax.Array, idx: jax.Array, values: jax.Array) -> jax.Array:
        return x.at[idx].set(values)


# Kept under their old names: the transfer module holds the device vocabulary now.
_device = transfer.resolve
_name = transfer.device_name


def make_backend() -> JaxBackend:
    """Builds the JAX backend (called once by `dualtrain.backends.load`)."""
    return JaxBackend()
