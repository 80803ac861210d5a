"""Small Crafts and helpers shared by the checkpoint tests."""

from __future__ import annotations

import numpy as np

from dualtrain import Craft, dock


class Net(Craft):
    """Dense -> BatchNorm -> Dense: parameters, running statistics and torch's batch count."""

    def __init__(self, scope: str = "Net", hidden: int = 16) -> None:
        super().__init__(scope)
        self.fc1 = dock.Dense(3, hidden)
        self.bn = dock.BatchNorm(hidden)
        self.fc2 = dock.Dense(hidden, 2)

    def run(self, x):
        return self.fc2(dock.tanh(self.bn(self.fc1(x))))


class MLP(Craft):
    """Dense -> BatchNorm -> tanh -> Dense, 8 inputs and 3 classes: the optimizer laws' model."""

    def __init__(self, hidden=16):
        super().__init__("MLP")
        self.fc1 = dock.Dense(8, hidden)
        self.bn = dock.BatchNorm(hidden)
        self.fc2 = dock.Dense(hidden, 3)

    def run(self, x):
        return self.fc2(dock.tanh(self.bn(self.fc1(x))))


X = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)


def torch_values(module) -> dict[str, np.ndarray]:
    """Every parameter and buffer of a torch module, copied to NumPy."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def jax_values(module) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in {**module.params, **module.state}.items()}


def train_torch(module, steps: int = 2) -> None:
    """A few SGD steps in train mode, so weights, running stats and batch counts move."""
    import torch

    opt = torch.optim.SGD(module.parameters(), 0.1)
    module.train()
    for _ in range(steps):
        opt.zero_grad()
        module(torch.from_numpy(X)).square().mean().backward()
        opt.step()


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
