"""A store sharded over 2 processes joined by jax.distributed trains as one on the union."""

from __future__ import annotations

import dualtrain
from tests.embeddings.cross.sharded_run import check
from tests.embeddings.sharded_universes import universe


def test_two_jax_processes_equal_one_process_on_the_union():
    results = dualtrain.Multiverse(universe, 2, backend="jax", processes=2, timeout=240)("jax")
    check("jax", results)
    # Ids (8 bytes a row) and rows (12) are padded to 16: two programs, compiled once each.
    assert results[-1]["ranks"][0]["programs"] == [(16, 8), (16, 12)]
