"""The ONNX Runtime rung computes what eager computes, whatever changed since its export.

A graph keeps as constants what the forward read when it was exported. Every way a user
changes weights (an optimizer, the classic ``p.data -= lr * p.grad``, ``load_state_dict``,
``nn.init``, in-place ops under ``no_grad``, a buffer's ``.data``) and the module-level
values and closure cells a forward reads are followed: evaluation equals eager after each
(the old rung served stale weights after ``.data`` writes and froze ``SCALE["k"]``). Crafts
whose convolutions pad "same" export (they did not: sizes are tensors under the trace).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from dualtrain import Craft, dock
from dualtrain.craft.padding import autopad
from dualtrain_torch import accelerate, realize
from dualtrain_torch.compilation import explain
from dualtrain_torch.compilation.rungs import onnx_available
from dualtrain_torch.layers import same_pads
from tests.accelerate.torch import compilation_models as models
from tests.accelerate.torch.compilation_models import FORCE

pytestmark = pytest.mark.skipif(not onnx_available(), reason="the onnx extra is not installed")
ONNX = ["ONNXRUNTIME", "PYTORCH"]


def batch(seed: int, shape: tuple[int, ...] = (6, 3, 8, 8)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _optimizer(m: nn.Module, g: torch.Generator) -> None:
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.3)
    x = torch.randn((6, 3, 8, 8), generator=g)
    torch.manual_seed(0)  # the same dropout draws on both
    nn.functional.cross_entropy(m(x), torch.zeros(6, dtype=torch.long)).backward()
    opt.step()
    m.eval()


def _data(m: nn.Module, g: torch.Generator) -> None:
    for p in m.parameters():
        p.data -= 0.1 * torch.randn(p.shape, generator=g)  # bumps no version counter


def _load_state_dict(m: nn.Module, g: torch.Generator) -> None:
    m.load_state_dict(models.cnn(int(torch.randint(0, 99, (1,), generator=g))).state_dict())


def _init(m: nn.Module, g: torch.Generator) -> None:
    nn.init.normal_(m[0].weight, generator=g)


def _in_place(m: nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1.0 + 0.5 * torch.rand((), generator=g))


def _buffer_data(m: nn.Module, g: torch.Generator) -> None:
    m[1].running_mean.data += torch.randn(m[1].running_mean.shape, generator=g)


WAYS: dict[str, Callable[[nn.Module, torch.Generator], None]] = {
    "optimizer": _optimizer,
    ".data": _data,
    "load_state_dict": _load_state_dict,
    "nn.init": _init,
    "in-place": _in_place,
    "buffer .data": _buffer_data,
}


def same_output(model: nn.Module, reference: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(
    ways=st.lists(st.sampled_from(sorted(WAYS)), min_size=1, max_size=3), seed=st.integers(0, 99)
)
def test_every_way_of_changing_weights_is_followed(ways: list[str], seed: int) -> None:
    model = models.cnn(seed).eval()
    reference = copy.deepcopy(model)
    accelerate(model, ONNX, **FORCE)
    x = batch(seed)
    same_output(model, reference, x)
    assert explain(model).chosen("eval") == "ONNXRUNTIME"
    for way in ways:  # an epoch each: change, then evaluate twice
        for m in (model, reference):
            WAYS[way](m, torch.Generator().manual_seed(seed))
        same_output(model, reference, x)
        same_output(model, reference, x)


SCALE = {"k": 1.0}
OFFSET = 0.0


class ReadsGlobals(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * SCALE["k"] + OFFSET


def closing_over(factor: list[float]) -> nn.Module:
    class ReadsACell(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(1)
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * factor[0]

    return ReadsACell()


class CraftReadsGlobals(Craft):
    def __init__(self) -> None:
        super().__init__("READS")
        self.fc = dock.Dense(4, 3)

    def run(self, x: Any) -> Any:
        return self.fc(x) * SCALE["k"]


def test_values_a_forward_reads_from_outside_the_module_are_followed() -> None:
    global OFFSET
    factor = [1.0]
    x = batch(0, (5, 4))
    made: list[Callable[[], nn.Module]] = [
        ReadsGlobals,
        lambda: closing_over(factor),
        lambda: realize(CraftReadsGlobals(), seed=0),
    ]
    for make in made:
        SCALE["k"], OFFSET, factor[0] = 1.0, 0.0, 1.0
        model = make().eval()
        accelerate(model, ONNX, **FORCE)
        with torch.no_grad():
            first = model(x)
        assert explain(model).chosen("eval") == "ONNXRUNTIME"
        SCALE["k"], OFFSET, factor[0] = 7.0, 0.5, 3.0
        with torch.no_grad():
            got = model(x)
        scale = 7.0 if make is not made[1] else 3.0  # what eager computes now
        offset = 0.5 if make is ReadsGlobals else 0.0
        torch.testing.assert_close(got, first * scale + offset, rtol=1e-4, atol=1e-5)
        assert "follows: parameters and buffers by value" in str(explain(model))
    SCALE["k"], OFFSET = 1.0, 0.0


class SameCNN(Craft):
    def __init__(self, kernel: int, stride: int) -> None:
        super().__init__("SAME")
        self.conv = dock.Conv(3, 4, kernel, stride=stride, padding="same")
        self.flat = dock.Flatten()

    def run(self, x: Any) -> Any:
        return self.flat(dock.relu(self.conv(x)))


@pytest.mark.parametrize(("kernel", "stride"), [(3, 1), (2, 1), (4, 1), (3, 2), (2, 3)])
def test_a_craft_padding_same_exports_and_equals_eager(kernel: int, stride: int) -> None:
    model = realize(SameCNN(kernel, stride), seed=kernel).eval()
    reference = copy.deepcopy(model)
    accelerate(model, ONNX, **FORCE)
    for size in (9, 12):  # two signatures: each exported, each equal to eager
        x = batch(size, (2, 3, size, size + 1))
        same_output(model, reference, x)
    chosen = [d.chosen for d in explain(model).decisions]
    assert chosen == ["ONNXRUNTIME", "ONNXRUNTIME"], str(explain(model))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    data=st.data(),
)
def test_same_pads_are_autopads_on_ints_and_on_size_tensors(sizes: list[int], data: Any) -> None:
    n = len(sizes)
    kernel = tuple(data.draw(st.lists(st.integers(1, 6), min_size=n, max_size=n)))
    stride = tuple(data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)))
    dilation = tuple(data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)))
    spec = dock.Conv(1, 1, kernel, stride=stride, padding="same", dilation=dilation)
    want = [tuple(p) for p in autopad(tuple(sizes), kernel, stride, dilation)]
    assert same_pads(sizes, spec) == want
    traced = same_pads([torch.tensor(s) for s in sizes], spec)
    assert [(int(lo), int(hi)) for lo, hi in traced] == want
