"""TorchInductor's compiled programs kept under dualtrain's cache folder, beside the ladder's
verdicts (dualtrain_torch.compilation.cache), the torch half of what
tests/accelerate/jax/test_compile_cache.py checks for XLA.

Each run is a fresh process (TorchInductor settles its folder at its first compile): the
first compile through the ladder writes its programs under ``$DUALTRAIN_CACHE_DIR/inductor``
and a second process finds them there; a folder the user named is left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CHILD_TIMEOUT_S

pytest.importorskip("torch")

RUN = """
import json, os
import torch
from torch._dynamo.utils import counters
from dualtrain_torch.compilation.rungs import compile_apart
def f(x):
    return torch.tanh(x @ x.T).sum()
fast = compile_apart(f, {"fallback_random": True})
value = float(fast(torch.ones(8, 8)))
print(json.dumps({"value": value, "dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                  "hits": counters["inductor"]["fxgraph_cache_hit"]}))
"""


def run(tmp_path: Path, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    environ.update(DUALTRAIN_CACHE_DIR=str(tmp_path / "cache"), **env)
    out = subprocess.run(
        [sys.executable, "-c", RUN],
        capture_output=True,
        text=True,
        env=environ,
        timeout=CHILD_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_first_compile_names_dualtrains_folder_and_a_second_run_reads_it(tmp_path):
    folder = tmp_path / "cache" / "inductor"
    first = run(tmp_path)
    assert first["dir"] == str(folder)
    assert any(folder.rglob("*")), "nothing compiled was kept"
    second = run(tmp_path)
    assert second["value"] == first["value"]
    assert second["hits"] >= 1, "the second process compiled again"


def test_a_folder_the_user_named_is_left_alone(tmp_path):
    mine = tmp_path / "mine"
    out = run(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(mine))
    assert out["dir"] == str(mine)
    assert any(mine.rglob("*"))
    assert not (tmp_path / "cache" / "inductor").exists()
