"""The compile ladder on a CUDA device: the rungs only a GPU has, verified like the others."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from dualtrain_torch import TrainingLearner, accelerate
from dualtrain_torch.compilation import explain
from tests.accelerate.torch import compilation_models as models

pytestmark = pytest.mark.gpu

# no compile budget: a verdict must not turn on how busy the machine is; budget=inf: every
# rung is tried at the first call (a job otherwise starts eager, rungs waiting for payback)
FORCE = {
    "min_speedup": 1e-9,
    "warm_steps": 2,
    "cache": False,
    "compile_budget": 1e9,
    "budget": math.inf,
}


def _cnn() -> nn.Module:
    return models.cnn(0).cuda()


@pytest.mark.parametrize("rung", ["CUDA_GRAPHS", "TORCH_COMPILE", "CHANNELS_LAST"])
def test_a_cuda_rung_is_verified_and_trains_like_eager(rung):
    eager, fast = _cnn(), _cnn()
    accelerate(fast, [rung, "PYTORCH"], **FORCE)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, fast)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for step in range(3):
        x = torch.randn(8, 3, 8, 8, device="cuda", generator=gen)
        y = torch.randint(0, 5, (8,), device="cuda", generator=gen)
        for m, opt in zip((eager, fast), opts, strict=True):
            torch.manual_seed(step)
            opt.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    for (name, a), b in zip(eager.state_dict().items(), fast.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4, msg=name)
    attempt = explain(fast).decisions[0].attempts[0]
    assert attempt.rung == rung and attempt.status in ("chosen", "failed"), attempt
    for m in (eager, fast):
        m.eval()
    with torch.no_grad():
        torch.testing.assert_close(fast(x), eager(x), rtol=1e-3, atol=1e-4)


def test_onnx_runtime_says_why_it_is_not_used_on_cuda():
    model = _cnn().eval()
    accelerate(model, ["ONNXRUNTIME", "PYTORCH"], **FORCE)
    with torch.no_grad():
        model(torch.randn(4, 3, 8, 8, device="cuda"))
    attempt = explain(model).decisions[0].attempts[0]
    assert attempt.status == "unavailable" and "cuda" in attempt.reason.lower()


def test_the_learner_steps_on_cuda():
    eager, fast = _cnn(), _cnn()
    learner = TrainingLearner(
        fast,
        ["CHANNELS_LAST", "PYTORCH"],
        optimizer=torch.optim.Adam(fast.parameters(), lr=1e-3),
        **FORCE,
    )
    opt = torch.optim.Adam(eager.parameters(), lr=1e-3)
    x = torch.randn(8, 3, 8, 8, device="cuda")
    y = torch.randint(0, 5, (8,), device="cuda")
    for step in range(2):
        torch.manual_seed(step)
        got = learner.step(x, y)
        torch.manual_seed(step)
        opt.zero_grad()
        want = nn.functional.cross_entropy(eager(x), y)
        want.backward()
        opt.step()
        torch.testing.assert_close(got, want.detach(), rtol=1e-4, atol=1e-5)
    moved = copy.deepcopy(fast).cpu()
    assert next(moved.parameters()).device.type == "cpu"
