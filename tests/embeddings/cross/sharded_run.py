"""What the spawned sharded runs (torch, JAX) are held against: one process on the union."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.embeddings.ranks import attach, union
from tests.embeddings.runs import DIM, ROWS, store
from tests.embeddings.sharded_universes import CASES, STEPS, step


def check(framework: str, results: list[dict[str, Any]]) -> None:
    """Each case's gathered table and state equal one process's on the union batches."""
    ids, weights = union(STEPS, 2)
    for (name, mode, _), got in zip(CASES, results, strict=True):
        s = store()
        rows = attach(framework, name, mode, s)
        for batch, w in zip(ids, weights, strict=True):
            step(framework, rows, batch, w)
        rows.settle()
        rows.flush()
        want = {"weight": s.table, **s.state}
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
        ranks = got["ranks"]
        assert [r["rows"] for r in ranks] == [(0, ROWS // 2), (ROWS // 2, ROWS)]
        assert not any(r["allocated_at_sync"] for r in ranks)
        assert all(r["bytes"] == ROWS // 2 * DIM * 4 for r in ranks)
