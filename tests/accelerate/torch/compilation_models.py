"""Models the compile-ladder tests share (module level, so instances pickle)."""

from __future__ import annotations

import collections
import math

import torch
from torch import nn

from dualtrain_torch.compilation import accelerate_model

# Ladder options for tests of what a rung computes: any verified candidate wins, nothing is
# cached, no compile is too slow, and (budget=inf) the whole ladder climbs at the first call
# (payback's own rules: tests/accelerate/test_accelerate_payback.py).
FORCE = {
    "min_speedup": 1e-9,
    "warm_steps": 1,
    "cache": False,
    "compile_budget": 1e9,
    "budget": math.inf,
}


def mlp(seed: int = 0, dropout: float = 0.2) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 5)
    )


def cnn(seed: int = 0, dropout: float = 0.2) -> nn.Module:
    # No bias before BatchNorm: its true gradient is 0 and Adam would turn eager's rounding
    # noise into +-lr steps, which no two orderings of the same sums agree on.
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(8 * 4 * 4, 5),
    )


class StridedCNN(nn.Module):
    """Reads its activation's memory as if it were NCHW-contiguous (a hand-written kernel's
    assumption): under channels-last it computes something else, silently."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        n, c, h, w = y.shape
        y = torch.as_strided(y, (n, c * h * w), (c * h * w, 1))
        return self.head(y)


class ViewCNN(nn.Module):
    """``view`` after a convolution: fails on a channels-last activation."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.head(y.view(y.shape[0], -1))


class BranchyCNN(nn.Module):
    """A data-dependent branch: a traced graph (ONNX export) would freeze one side."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.sum() > 0:
            return y.relu()
        return -y


class SometimesViewCNN(nn.Module):
    """Verifies on ordinary batches, then fails under channels-last on a batch whose first
    value is large: a run-time failure after the choice."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if float(x[0, 0, 0, 0]) > 100:
            return y.view(y.shape[0], -1)
        return y.flatten(1)


@accelerate_model(backends=["CHANNELS_LAST", "PYTORCH"], cache=False, warm_steps=1)
class DecoratedNet(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.head = nn.Linear(width * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).relu().flatten(1))


class WiderNet(DecoratedNet):
    """A subclass of a decorated class: accelerated once, after its own __init__."""

    def __init__(self) -> None:
        super().__init__(width=4)
        self.extra = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.extra(super().forward(x))


@accelerate_model
class BareNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class ScalesItsInput(nn.Module):
    """Writes into its input (``x.mul_``): a trial must not write into the user's tensor."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return self.conv(x)


class OwnNoise(nn.Module):
    """Draws from a generator it holds, in every mode (noise injection)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.gen = torch.Generator().manual_seed(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + torch.randn(4, 8, 8, generator=self.gen)


class NoisyBranch(nn.Module):
    """Draws from torch's generator in evaluation too, then branches on the data: the ONNX
    export runs (and draws) before it finds the branch and gives up."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x) + torch.randn(1)
        if y.sum() > 0:
            return y
        return -y


class Tempered(nn.Module):
    """Reads a plain attribute and a tensor kept as a plain attribute (not a buffer)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.temperature = 1.0
        self.mask = torch.ones(4, 8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) / self.temperature * self.mask


class CountsCalls(nn.Module):
    """Changes plain attributes on every call (a count, a log, a tally), and its output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.calls = 0
        self.log: list[int] = []
        self.tally: collections.defaultdict[str, int] = collections.defaultdict(int)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.log.append(self.calls)
        self.tally["train" if self.training else "eval"] += 1
        return self.conv(x) * self.calls


class TiedHead(nn.Module):
    """An output layer sharing its weight with an embedding outside the module."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight.t()


class FlatHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).flatten(1))


class EditedFlatHead(FlatHead):
    """`FlatHead` after its forward was edited (same name, repr and parameters): it now reads
    the activation's memory as NCHW, which channels-last breaks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.head(torch.as_strided(y, (y.shape[0], 4 * 8 * 8), (4 * 8 * 8, 1)))


EditedFlatHead.__name__ = EditedFlatHead.__qualname__ = "FlatHead"


class ReassignsBuffers(nn.Module):
    """Keeps an EMA and a step count by assigning new tensors to its buffers (no in-place
    update), one of them not persistent."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.running: torch.Tensor
        self.steps: torch.Tensor
        self.register_buffer("running", torch.zeros(4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.training:
            self.running = 0.9 * self.running + 0.1 * y.detach().mean((0, 2, 3))
            self.steps = self.steps + 1
        return y - self.running[:, None, None]


class TemperedLoss(nn.Module):
    """A loss with a learned temperature and a running count: state outside the model."""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(()))
        self.seen: torch.Tensor
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.seen = self.seen + target.numel()
        return nn.functional.cross_entropy(out / self.temperature, target)


class ManyBuffers(nn.Module):
    """A cheap forward and many buffers it never reads (lookup tables): each call under a
    non-eager rung copies the buffers first (to fall back cleanly), which costs far more
    than the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 1)  # what makes CHANNELS_LAST applicable
        for i in range(2000):
            self.register_buffer(f"table{i}", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


class CountsThenSometimesViews(nn.Module):
    """Advances a plain attribute, then fails under channels-last on a batch whose first
    value is large (after the choice): the fallback must not advance it twice."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.conv(x) * self.calls
        if float(x[0, 0, 0, 0]) > 100:
            return y.view(y.shape[0], -1)
        return y.flatten(1)
