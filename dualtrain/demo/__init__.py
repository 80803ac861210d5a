"""`dualtrain demo`: the whole library end to end, on data made on the spot.

`run` is the craft part and the entry (backends, exchange, training, checkpoint crossing),
`fuel` packs images and trains from a Tank, `embeddings` trains from EmbeddingStores, and
`table` draws the loss tables they share. Each framework's half is its adapter's ``demo``.
"""

from __future__ import annotations

from dualtrain.demo.run import TRAIN_CONTRACT, DemoNet, make_data, run
from dualtrain.demo.table import loss_table

__all__ = ["TRAIN_CONTRACT", "DemoNet", "loss_table", "make_data", "run"]
