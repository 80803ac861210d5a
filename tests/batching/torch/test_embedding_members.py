"""Crafts with an Embedding batch under vmap: ids are checked under torch.func transforms."""

from __future__ import annotations

import pytest

from dualtrain import Craft, dock
from dualtrain.errors import OutOfRangeError

torch = pytest.importorskip("torch")
dualtrain_torch = pytest.importorskip("dualtrain_torch")


class Bag(Craft):
    def __init__(self):
        super().__init__("BAG")
        self.table = dock.Embedding(10, 4)
        self.head = dock.Dense(4, 2)

    def run(self, ids):
        return self.head(self.table(ids))


@pytest.mark.parametrize("strategy", ["vmap", "chunked", "loop"])
def test_an_embedding_craft_runs_under_every_strategy_and_equals_its_members(strategy):
    net = dualtrain_torch.realize(Bag(), seed=1)
    bm = dualtrain_torch.BatchModule(net, 3, seed=2, strategy=strategy)
    ids = torch.randint(0, 10, (3, 5), generator=torch.Generator().manual_seed(0))
    out = bm(ids)
    for i in range(3):
        torch.testing.assert_close(out[i], bm.extract(i)(ids[i]))
    assert strategy in bm.explain()


def test_an_id_out_of_range_is_named_under_vmap_not_an_index_error():
    bm = dualtrain_torch.BatchModule(dualtrain_torch.realize(Bag()), 2, strategy="vmap")
    ids = torch.zeros((2, 4), dtype=torch.int64)
    ids[1, 2] = 12
    with pytest.raises(OutOfRangeError, match="id 12 at position"):
        bm(ids)
