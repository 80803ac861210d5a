"""JAX-only behaviour of the adapter."""

import numpy as np
import pytest

import dualtrain
from dualtrain import convert, count_copies
from tests.helpers import address

jax = pytest.importorskip("jax")
jnp = jax.numpy


def test_numpy_allocations_need_a_copy_dualtrain_allocations_do_not():
    plain = np.ones(1 << 16, np.float32)  # NumPy starts big buffers 16 bytes past 64
    aligned = dualtrain.aligned_copy(plain)
    with count_copies() as c:
        convert(aligned, to="jax")
    assert c.copies == 0
    with count_copies() as c:
        j = convert(plain, to="jax")
    assert c.copies == (0 if dualtrain.is_aligned(plain) else 1)
    assert dualtrain.load("jax").data_address(j) % 64 == 0


def test_numpy_bfloat16_reaches_jax_with_one_copy_and_exact_bits():
    import ml_dtypes

    a = dualtrain.aligned_empty(5, ml_dtypes.bfloat16)
    a[:] = [0.5, -1, 2, float("inf"), 3]
    with count_copies() as c:
        j = convert(a, to="jax")
    assert c.copies == 1 and j.dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(j).view(np.uint16), a.view(np.uint16))


def test_jax_owns_tracers_inside_transformations():
    backend = dualtrain.load("jax")
    owned = []
    jax.jit(lambda x: owned.append(backend.owns(x)) or x)(jnp.ones(2))
    assert owned == [True]


@pytest.mark.multidevice
def test_sharded_arrays_report_their_devices():
    mesh = jax.make_mesh((4,), ("d",))
    x = jax.device_put(
        jnp.zeros(8), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    )
    assert dualtrain.load("jax").device_of(x).startswith("sharded:")
    assert len(jax.devices()) == 4


def test_jax_arrays_put_rows_out_of_place():
    backend = dualtrain.load("jax")
    x = jnp.zeros((3, 2))
    y = backend.put_rows(x, jnp.array([1]), jnp.ones((1, 2)))
    assert float(x.sum()) == 0 and float(y.sum()) == 2
    assert address(y) != address(x)
