"""`dualtrain demo`: the whole library end to end, on data made on the spot.

`run` is the entry (backends, exchange, the one-Craft comparison), `pipeline` the images ->
pack -> Tank -> Craft -> DashBoard -> evaluation -> checkpoint crossing, `sweep` model
batching, `embeddings` the EmbeddingStores, `multiverse` data-parallel training, `fuel` the
pictures the examples share, and `table` the loss tables. Each framework's half is its
adapter's ``demo``.
"""

from __future__ import annotations

from dualtrain.demo.run import TRAIN_CONTRACT, DemoNet, make_data, run
from dualtrain.demo.table import loss_table

__all__ = ["TRAIN_CONTRACT", "DemoNet", "loss_table", "make_data", "run"]
