"""The law of a sharded store's anchors, under torch.distributed (gloo processes): an anchor
written by 2 ranks loads into 1 and into 3; one written by 1 loads into 2; and each run
resumed from one continues as the uninterrupted run does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoint.sharded_law import check_law

pytest.importorskip("torch")


def test_anchors_move_between_world_sizes_1_2_and_3_under_torch(tmp_path: Path) -> None:
    check_law("torch", "exact", tmp_path, {})
