"""Adversarial inputs to the torch BatchModule: frozen parameters, non-persistent buffers,
dtype changes after construction, and per-member inputs inside dicts and tuples."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from dualtrain.errors import ShapeError  # noqa: E402
from dualtrain_torch.batching import BatchModule  # noqa: E402


def test_frozen_parameters_stay_frozen() -> None:
    """A parameter with requires_grad=False is not trained as a member."""
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    m[0].weight.requires_grad_(False)
    bm = BatchModule(m, 3, check_isolation=False)
    frozen = bm.get_parameter("stack.0.weight")
    assert not frozen.requires_grad
    assert bm.get_parameter("stack.0.bias").requires_grad
    before = frozen.detach().clone()
    opt = torch.optim.SGD(bm.parameters(), lr=0.5)
    bm(torch.randn(3, 5, 3)).sum().backward()
    opt.step()
    assert torch.equal(frozen, before)
    assert not bm.extract(1)[0].weight.requires_grad


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("scale", torch.full((2,), 2.0), persistent=False)
        self.register_buffer("kept", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale + self.kept


def test_non_persistent_buffers_stay_out_of_state_dict() -> None:
    bm = BatchModule(_Scaled(), 3, check_isolation=False)
    keys = set(bm.state_dict())
    assert keys == {"stack.lin.weight", "stack.lin.bias", "stack.kept"}
    x = torch.randn(3, 4, 3)
    other = BatchModule(_Scaled(), 3, seed=5, check_isolation=False)
    other.load_state_dict(bm.state_dict())  # strict: both sides agree on the keys
    torch.testing.assert_close(other(x), bm(x))
    torch.testing.assert_close(bm.extract(2)(x[2]), bm(x)[2])


def test_insert_after_changing_dtype() -> None:
    """After bm.double(), members are float64: a float64 module inserts, a float32 one not."""
    bm = BatchModule(nn.Linear(3, 2), 3, check_isolation=False)
    bm(torch.randn(3, 2, 3)).sum().backward()
    bm.double()
    new = nn.Linear(3, 2).double()
    bm.insert(0, new)
    x = torch.randn(3, 2, 3, dtype=torch.float64)
    torch.testing.assert_close(bm(x)[0], new(x[0]))
    with pytest.raises(Exception, match="float64"):
        bm.insert(1, nn.Linear(3, 2))


class _DictNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 2)
        self.b = nn.Linear(4, 2)

    def forward(self, batch: dict, pair: tuple, scale: float) -> torch.Tensor:
        return (self.a(batch["x"]) + self.b(pair[0]) - pair[1]) * scale


@pytest.mark.parametrize("strategy", ["vmap", "chunked", "loop", "auto"])
def test_tensors_inside_dict_and_tuple_inputs_are_per_member(strategy: str) -> None:
    """Each member reads its own row of tensors nested in dicts and tuples, as a loop would."""
    bm = BatchModule(_DictNet(), 4, strategy=strategy, memory_budget=1200)
    x, z, w = torch.randn(4, 5, 3), torch.randn(4, 5, 4), torch.randn(4, 5, 2)
    out = bm({"x": x}, (z, w), 0.5)
    assert out.shape == (4, 5, 2)
    for i in range(4):
        want = bm.extract(i)({"x": x[i]}, (z[i], w[i]), 0.5)
        torch.testing.assert_close(out[i], want)


def test_nested_input_with_wrong_member_count_is_refused() -> None:
    bm = BatchModule(_DictNet(), 4, check_isolation=False)
    with pytest.raises(ShapeError, match=r"inputs\[0\]\['x'\]"):
        bm({"x": torch.randn(3, 5, 3)}, (torch.randn(4, 5, 4), torch.randn(4, 5, 2)), 1.0)
