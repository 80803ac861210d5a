"""docs/migration.md's examples (the seeds' own, imports changed, and dualtrain's forms) run
as written, each block alone from an empty working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.migration.guide_blocks import blocks, run_block

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "migration.md"


@pytest.mark.parametrize("index", range(len(blocks(GUIDE))))
def test_migration_guide_block_runs(index: int, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    run_block(blocks(GUIDE)[index], f"docs/migration.md block {index}", tmp_path)
