"""Each TORCH_COMPILE trial compiles in a cache of its own (#29: no stale, silent rung).

Dynamo keeps compiled code on the code object of the function it wraps, and wraps every
bound method in the same one: the trials of all signatures of all accelerated modules in a
process shared one cache, so the 9th compile met ``recompile_limit`` (8), ran eager under
the rung's name and warned on the user's stderr.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from dualtrain_torch import accelerate
from dualtrain_torch.compilation import explain
from tests.accelerate.torch.compilation_models import FORCE


# inductor's own DeprecationWarning (torch.jit.script_method), an error under this suite
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_ten_signatures_each_compile_and_warn_nothing(caplog: pytest.LogCaptureFixture) -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh()).eval()
    reference = nn.Sequential(nn.Linear(4, 3), nn.Tanh()).eval()
    reference.load_state_dict(model.state_dict())
    accelerate(model, ["TORCH_COMPILE", "PYTORCH"], max_signatures=12, **FORCE)
    before = counters["stats"]["unique_graphs"]
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"), torch.no_grad():
        for n in range(1, 11):
            x = torch.randn(n, 4)
            torch.testing.assert_close(model(x), reference(x))
    assert not [r for r in caplog.records if "recompile_limit" in r.getMessage()]
    assert counters["stats"]["unique_graphs"] - before >= 10  # each signature compiled
    assert [d.chosen for d in explain(model).decisions] == ["TORCH_COMPILE"] * 10
