"""A store sharded over 2 gloo processes trains as one process on the union of the batches."""

from __future__ import annotations

import dualtrain
from tests.embeddings.cross.sharded_run import check
from tests.embeddings.sharded_universes import universe


def test_two_gloo_processes_equal_one_process_on_the_union():
    check("torch", dualtrain.Multiverse(universe, 2, timeout=240)("torch"))


def test_stores_made_unlike_on_the_ranks_are_refused():
    from tests.embeddings.sharded_universes import unlike

    message = dualtrain.Multiverse(unlike, 2, timeout=240)()
    assert "made alike" in message and "(40, 3, 'float32', 1, 0.5, 'normal')" in message
