"""Rank-0 checkpoints and a death inside a collective, with real gloo processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualtrain import Multiverse, WorkerError
from tests.multiverse import framework_universes as fu


def test_rank_zero_writes_every_rank_reads_and_a_killed_peer_is_named(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match="rank 1 failed at step 0: killed by SIGKILL"):
        Multiverse(fu.rank_zero_then_death, 2)(str(tmp_path))
    log = sorted((tmp_path / "log").read_text().splitlines())
    assert log == ["drop 0", "drop 0", "to 0", "to 1"]  # two writes, both by rank 0
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["dropped"] for s in seen] == [f"{tmp_path}/anchor-0"] * 2  # rank 0's path
    assert [s["read"] for s in seen] == ["read", "read"]
    assert seen[0]["failed"] == ["ValueError", "disk full"]
    assert seen[1]["failed"][0] == "CheckpointError" and "disk full" in seen[1]["failed"][1]
    assert seen[1]["save_path"] == str(tmp_path)
