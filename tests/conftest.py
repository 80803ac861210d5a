"""Test set-up shared by every folder: JAX host devices, markers, the `backend` fixture."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Four CPU devices for JAX's multi-device paths; must be set before jax is first imported.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The decision caches (the compile ladder's, model batching's): never the user's ~/.cache
# from the tests, and one folder per process, so xdist workers never read each other's
# decisions (a test that expects a decision to be measured would otherwise find it cached
# by whichever worker ran first). Each test that reads one back names its own folder.
os.environ["DUALTRAIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="dualtrain-test-cache-")
import importlib.util

import pytest
from hypothesis import HealthCheck, settings

atexit.register(shutil.rmtree, os.environ["DUALTRAIN_CACHE_DIR"], True)

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
