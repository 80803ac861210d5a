"""Test set-up shared by every folder: JAX host devices, markers, the `backend` fixture."""

from __future__ import annotations

import os

# Four CPU devices for JAX's multi-device paths; must be set before jax is first imported.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The compile ladder's decision cache: never the user's ~/.cache from the tests (each test
# that reads it back names its own folder).
if "DUALTRAIN_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["DUALTRAIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="dualtrain-test-cache-")
    atexit.register(shutil.rmtree, os.environ["DUALTRAIN_CACHE_DIR"], True)

import importlib.util

import pytest
from hypothesis import HealthCheck, settings

# Two shared cores: no per-example deadline (timing is benchmarks' business), fewer
# examples in CI. DUALTRAIN_HYPOTHESIS=thorough asks for more.
settings.register_profile(
    "default",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=400)
settings.load_profile(os.environ.get("DUALTRAIN_HYPOTHESIS", "default"))

FRAMEWORKS = ("numpy", "torch", "jax")


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=FRAMEWORKS, scope="session")
def backend(request: pytest.FixtureRequest):
    """Each backend in turn (skipped where its framework is not installed)."""
    if request.param != "numpy":
        pytest.importorskip(request.param)
    import dualtrain

    return dualtrain.load(request.param)
