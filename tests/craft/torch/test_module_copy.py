"""A realized torch module survives copy.deepcopy and pickle, as any nn.Module does."""

from __future__ import annotations

import copy
import pickle

import pytest

from tests.checkpoint.crafts import Net

torch = pytest.importorskip("torch")
from dualtrain import Craft, dock  # noqa: E402
from dualtrain_torch import realize  # noqa: E402


class Tied(Craft):
    """A nested Craft, a layer used twice (tied weights), a list of layers, BatchNorm."""

    def __init__(self) -> None:
        super().__init__("TIED")
        self.inner = Net()
        self.shared = dock.Dense(4, 4)
        self.heads = [dock.Dense(4, 2), dock.Dense(4, 3)]
        self.norm = dock.BatchNorm(4)

    def run(self, x):
        h = self.norm(self.shared(self.shared(x)))
        return self.heads[0](h), self.heads[1](h)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_runs_alike_and_owns_its_weights(how):
    module = realize(Tied(), seed=3)
    module.train()
    x = torch.randn(5, 4)
    twin = copy.deepcopy(module) if how == "deepcopy" else pickle.loads(pickle.dumps(module))
    assert twin.training
    for a, b in zip(twin(x), module(x), strict=True):  # both in training: stats move alike
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert twin.state_dict().keys() == module.state_dict().keys()
    for key, value in module.state_dict().items():
        torch.testing.assert_close(twin.state_dict()[key], value, rtol=0, atol=0)
    # tied weights stay tied in the copy, and the copy's weights are its own
    assert sum(1 for _ in twin.parameters()) == sum(1 for _ in module.parameters())
    with torch.no_grad():
        twin.shared.weight.add_(1.0)
    assert not torch.equal(twin(x)[0], module(x)[0])
    twin.eval()
    assert module.training  # train mode is per copy too
