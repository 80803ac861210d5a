import numpy as np
import pytest

import dualtrain
from dualtrain import backends


def test_numpy_arrays_and_scalars_find_the_numpy_backend():
    assert dualtrain.backend_of(np.ones(3)).name == "numpy"
    assert dualtrain.backend_of(np.float32(1.0)).name == "numpy"
    # Python scalars and None are skipped, as array_namespace does.
    assert dualtrain.backend_of(1.0, np.ones(2), None).name == "numpy"


def test_unknown_types_and_empty_calls_are_clear_type_errors():
    with pytest.raises(TypeError, match="got list"):
        dualtrain.backend_of([1, 2])
    with pytest.raises(dualtrain.BackendError, match="at least one array"):
        dualtrain.backend_of(1, 2.0)


def test_load_refuses_unknown_names_and_caches_instances():
    with pytest.raises(
        ValueError, match="backend must be one of 'numpy', 'torch', 'jax', 'cupy'; got backend='tf'"
    ):
        dualtrain.load("tf")
    assert dualtrain.load("numpy") is dualtrain.load("numpy")


def test_load_part_only_reaches_adapters():
    with pytest.raises(ValueError, match="backend must be 'torch' or 'jax'"):
        backends.load_part("numpy", "demo")


def test_available_lists_numpy_first():
    assert dualtrain.available()[0] == "numpy"


def test_the_numpy_backend_satisfies_the_protocol():
    assert isinstance(dualtrain.load("numpy"), dualtrain.Backend)
