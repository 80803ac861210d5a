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


def test_declared_tables_read_each_adapters_policy_without_its_framework():
    """backends.Declared: a table by framework over what each adapter's policy declares,
    behaving as the dict it replaced (equality, repr, `|`), and no framework imported."""
    import subprocess
    import sys

    from dualtrain.accelerate import rungs
    from dualtrain.batching import members

    for framework in backends.FRAMEWORKS:
        policy = backends.policy(framework)
        assert rungs.RUNGS[framework] == policy.LADDER.rungs
        assert rungs.DEFAULTS[framework] == policy.LADDER.defaults
        assert members.STRATEGIES[framework] == policy.STRATEGIES.names
    table = dict(rungs.EAGER)
    assert table == rungs.EAGER and repr(rungs.EAGER) == repr(table)
    assert {"x": "y", **table} == {"x": "y"} | rungs.EAGER
    assert {**table, "x": "y"} == rungs.EAGER | {"x": "y"}
    with pytest.raises(KeyError):
        rungs.EAGER["numpy"]
    code = (
        "import sys; from dualtrain.accelerate import rungs; dict(rungs.RUNGS); "
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
