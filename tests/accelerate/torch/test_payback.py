"""The torch ladder's probation with a real model (#29): eager from the first call, a
candidate climbed mid-job when its payback is due, the training unchanged by the switch.

Time is a fake clock the test moves by one second per step, so the due point is the same
on any machine; the rung's numbers are torch's own.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dualtrain.accelerate.dispatch import Probation
from dualtrain.accelerate.payback import due_at
from dualtrain.accelerate.rungs import PRIORS
from dualtrain_torch import accelerate
from dualtrain_torch.compilation import explain
from tests.accelerate.test_accelerate_ladder import FakeClock
from tests.accelerate.torch import compilation_models as models
from tests.accelerate.torch.test_compilation import train_steps


def _batches(n: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(6, 3, 8, 8, generator=g) for _ in range(n)]
    ys = [torch.randint(0, 4, (6,), generator=g) for _ in range(n)]
    return xs, ys, list(range(n))


@pytest.mark.parametrize("seed", [0, 7])
def test_a_rung_climbed_mid_training_changes_no_step(seed):
    """A BatchNorm CNN trained 80 steps: eager until CHANNELS_LAST is due (~68 s of 1 s
    steps), then CHANNELS_LAST; every parameter and buffer equals eager training's."""
    clock = FakeClock(0.0)
    eager, fast = models.cnn(seed), models.cnn(seed)
    accelerate(
        fast, ["CHANNELS_LAST", "PYTORCH"], cache=False, warm_steps=1, min_speedup=1e-9,
        clock=clock,
    )  # fmt: skip
    xs, ys, seeds = _batches(80, seed)
    want = train_steps(eager, torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9), xs, ys,
                       seeds)  # fmt: skip
    opt = torch.optim.SGD(fast.parameters(), lr=0.05, momentum=0.9)
    got, served = [], []
    for x, y, s in zip(xs, ys, seeds, strict=True):
        got += train_steps(fast, opt, [x], [y], [s])
        served.append(explain(fast).chosen("train"))
        clock.advance(1.0)
    due = due_at("CHANNELS_LAST", 1.0, PRIORS["CHANNELS_LAST"][0], 1)
    switched = served.index("CHANNELS_LAST")
    assert abs(switched - due) <= 2  # eager until its payback was due, then the rung
    assert set(served[switched:]) == {"CHANNELS_LAST"}
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(eager.state_dict().items(), fast.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)  # buffers moved once


class _Fragile(nn.Module):
    """Eager works; under channels-last, once that rung serves, its forward raises."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        serving = explain(self).chosen("train")  # CHANNELS_LAST only after its climb
        if x.is_contiguous(memory_format=torch.channels_last) and serving == "CHANNELS_LAST":
            raise RuntimeError("a kernel this layout lacks")
        return self.bn(self.conv(x)).mean(dim=(2, 3))


def test_a_rung_that_fails_on_the_switching_call_restores_and_hands_the_call_to_eager():
    clock = FakeClock(0.0)
    model = _Fragile()
    accelerate(
        model, ["CHANNELS_LAST", "PYTORCH"], cache=False, warm_steps=1, min_speedup=1e-9,
        clock=clock,
    )  # fmt: skip
    x = torch.randn(2, 3, 6, 6)
    runner = None
    for _ in range(200):
        before = model.bn.num_batches_tracked.item()
        model(x)
        assert model.bn.num_batches_tracked.item() == before + 1  # once per call, always
        clock.advance(1.0)
        runner = model.forward.decider.known("train", next(iter(model.forward.decider._keys))[1])
    decision = explain(model).decisions[0]
    assert decision.chosen == "PYTORCH"  # the rung failed at run time: eager for good
    assert any("failed at run time" in e for e in decision.events)
    assert not isinstance(runner, Probation)
