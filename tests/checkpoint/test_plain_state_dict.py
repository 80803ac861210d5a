"""A plain state_dict safetensors file (no dualtrain manifest) loads through `TimeMachine.to`.

Written by ``safetensors.torch.save_file(module.state_dict(), path)`` (or by NumPy's or flax's
writer under the same names), it loads into the torch and the JAX realization of the same
Craft, whole: every name present, no name more, shapes equal and dtypes of the same kind,
else a CheckpointError listing each difference and the model unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import CheckpointError, TimeMachine
from tests.checkpoint.crafts import Net, X, torch_values

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
import safetensors.numpy  # noqa: E402

from dualtrain_torch import craft as tcraft  # noqa: E402

FRAMEWORKS = ("torch", "jax")


def realize(framework: str, seed: int, hidden: int = 16) -> Any:
    craft = pytest.importorskip(f"dualtrain_{framework}.craft")
    return craft.realize(Net(hidden=hidden), seed=seed)


def values(module: Any) -> dict[str, np.ndarray]:
    """Every stored tensor of a realized module, by neutral name, as NumPy."""
    if module.dualtrain_backend == "torch":
        return torch_values(module)
    return {k: np.asarray(v) for k, v in {**module.params, **module.state}.items()}


def outputs(module: Any) -> np.ndarray:
    if module.dualtrain_backend == "torch":
        module.eval()
        return module(torch.from_numpy(X)).detach().numpy()
    return np.asarray(module(X))


def save_state_dict(module: Any, path: Path) -> None:
    st_torch.save_file(module.state_dict(), str(path))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@settings(max_examples=8)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_torch_state_dict_loads_into_either_realization(tmp_path_factory, framework, seed):
    source = tcraft.realize(Net(), seed=seed)
    with torch.no_grad():  # running statistics too, not only their initial values
        source.bn.running_mean.uniform_(-1, 1)
        source.bn.running_var.uniform_(0.5, 2)
    path = tmp_path_factory.mktemp("sd") / "model.safetensors"
    save_state_dict(source, path)
    target = realize(framework, seed=seed + 1)
    restored = TimeMachine().to(target, path)
    assert list(restored) == [] and restored.step is None and restored.extra == {}
    got, expected = values(target), torch_values(source)
    for name, value in got.items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
    np.testing.assert_allclose(outputs(target), outputs(source), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_numpy_written_file_of_the_same_names_loads(tmp_path, framework):
    source = tcraft.realize(Net(), seed=5)
    arrays = {k: v for k, v in torch_values(source).items() if "num_batches" not in k}
    path = tmp_path / "np.safetensors"
    safetensors.numpy.save_file(arrays, str(path))
    target = realize(framework, seed=6)
    assert list(TimeMachine().to(target, path)) == []
    for name, value in arrays.items():
        np.testing.assert_array_equal(values(target)[name], value, err_msg=name)


def damaged(module: Any, change: str) -> tuple[dict, str]:
    """The module's state_dict with one thing wrong, and the phrase naming it."""
    state = dict(module.state_dict())
    if change == "missing":
        del state["fc2.bias"]
        return state, "fc2.bias is in the model but not in"
    if change == "extra":
        state["fc3.weight"] = torch.zeros(2, 2)
        return state, "fc3.weight is in sd.safetensors but not in the model"
    if change == "shape":
        state["fc1.weight"] = torch.zeros(16, 4)
        return state, "fc1.weight is (16, 4) on disk but (16, 3) in the model"
    state["fc1.bias"] = torch.zeros(16, dtype=torch.int32)  # dtype kind
    return state, "fc1.bias is int32 on disk but float32 in the model"


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("change", ["missing", "extra", "shape", "dtype"])
def test_a_state_dict_that_does_not_fit_is_refused_whole(tmp_path, framework, change):
    state, says = damaged(tcraft.realize(Net(), seed=1), change)
    path = tmp_path / "sd.safetensors"
    st_torch.save_file(state, str(path))
    target = realize(framework, seed=2)
    before = values(target)
    with pytest.raises(CheckpointError) as err:
        TimeMachine().to(target, path)
    assert says in str(err.value) and "not a dualtrain checkpoint" in str(err.value)
    for name, value in values(target).items():  # nothing loaded
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_every_difference_is_listed(tmp_path):
    state = dict(tcraft.realize(Net(), seed=1).state_dict())
    del state["fc2.bias"]
    state["fc1.weight"] = torch.zeros(1)
    path = tmp_path / "sd.safetensors"
    st_torch.save_file(state, str(path))
    with pytest.raises(CheckpointError, match=r"fc1.weight is .*; fc2.bias is in the model"):
        TimeMachine().to(tcraft.realize(Net()), path)


def test_frozen_false_loads_what_fits_and_reports_the_rest(tmp_path):
    source = tcraft.realize(Net(), seed=1)
    state = dict(source.state_dict())
    del state["fc2.bias"]
    path = tmp_path / "sd.safetensors"
    st_torch.save_file(state, str(path))
    target = tcraft.realize(Net(), seed=2)
    assert list(TimeMachine().to(target, path, frozen=False)) == ["fc2.bias"]
    assert torch.equal(target.fc1.weight, source.fc1.weight)


def test_a_plain_file_holds_no_optimizer_state(tmp_path):
    module = tcraft.realize(Net())
    path = tmp_path / "sd.safetensors"
    save_state_dict(module, path)
    optimizer = torch.optim.SGD(module.parameters(), 0.1)
    with pytest.raises(CheckpointError, match=r"plain safetensors file .* no optimizer state"):
        TimeMachine().to(module, path, optimizer=optimizer)


def test_a_bfloat16_model_loads_a_float32_state_dict_cast(tmp_path):
    source = tcraft.realize(Net(), seed=3)
    path = tmp_path / "sd.safetensors"
    save_state_dict(source, path)
    target = tcraft.realize(Net(), seed=4, dtype="bfloat16")
    TimeMachine().to(target, path)
    assert torch.equal(target.fc1.weight, source.fc1.weight.to(torch.bfloat16))
