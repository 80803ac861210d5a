"""Embedding store: huge tables and their optimizer state in host memory.

`EmbeddingStore` holds the rows; ``dualtrain_torch.attach`` / ``dualtrain_jax.attach``
train the rows each batch touches with the framework's own optimizer.
"""

from __future__ import annotations

from dualtrain.embeddings.attachment import Attachment, ShardedAttachment
from dualtrain.embeddings.ids import Lookup, as_ids, lookup
from dualtrain.embeddings.init import BLOCK, fill
from dualtrain.embeddings.session import MODES, Batch, RowSession
from dualtrain.embeddings.sharding import Exchange, Route, Shard, Traffic, split
from dualtrain.embeddings.store import EmbeddingStore, MemoryReport

__all__ = [
    "Attachment",
    "BLOCK",
    "MODES",
    "Batch",
    "EmbeddingStore",
    "Exchange",
    "Lookup",
    "MemoryReport",
    "Route",
    "RowSession",
    "Shard",
    "ShardedAttachment",
    "as_ids",
    "fill",
    "lookup",
    "Traffic",
    "split",
]
