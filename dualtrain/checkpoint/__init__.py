"""Checkpoints: TimeMachine anchors of Crafts and embedding stores, moved between frameworks.

`anchor_file` is the file (safetensors layout, manifest, CRC-32s, atomic write), `anchor_names`
its naming, numbering and retention, `vocabulary` the words every manifest uses (formats,
backend and slot names, and what older formats said), `manifest` a Craft anchor's manifest,
`fit` how an anchor fits a model, `optim_state` the neutral optimizer schema, `seams` what
it asks of an adapter, `anchor_writer` and `anchor_reader` a Craft's anchors written and
loaded, `member_anchors` the members of a BatchModule as anchors, `member_sets` sets of them,
`embeddings` the anchors of an `EmbeddingStore`, and `time_machine` the user's entry, which
holds a writer, a reader and the member sets over both.
"""

from __future__ import annotations

from dualtrain.checkpoint.optim_state import OptimizerState
from dualtrain.checkpoint.time_machine import Restored, TimeMachine
from dualtrain.errors import CheckpointError

__all__ = ["CheckpointError", "OptimizerState", "Restored", "TimeMachine"]
