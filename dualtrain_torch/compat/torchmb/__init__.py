"""torchmb's API on dualtrain's batching, for code migrating from torchmb.

Change ``torchmb`` to ``dualtrain_torch.compat.torchmb`` in the imports and torchmb's README
and its own test suite run as written: this package has torchmb's modules (``base``,
``batch``, ``functional``, ``layers``, ``utils``, ``tests``, ``types``, ``adapters``) and
their names, on `dualtrain_torch.BatchModule` underneath (docs/migration.md, "torchmb", lists
each name and what differs). Beyond torchmb: ``batch_topk`` (the README's name for
``batch_accuracy``), ``register_module`` (the README's prose name), ``BATCH_MODULES`` and
``MovedNameError``, raised for the few torchmb names whose job dualtrain does another way.
"""

from __future__ import annotations

from dualtrain_torch.compat.torchmb.adapters import AbstractBatchAdapter
from dualtrain_torch.compat.torchmb.base import AbstractBatchModule
from dualtrain_torch.compat.torchmb.batch import BatchModule
from dualtrain_torch.compat.torchmb.functional import (
    batch_accuracy,
    batch_loss,
    batch_topk,
    inner_batch_size,
    merge_batch,
    split_batch,
)
from dualtrain_torch.compat.torchmb.layers import (
    BatchBatchNorm2d,
    BatchConv2d,
    BatchGroupNorm,
    BatchLinear,
)
from dualtrain_torch.compat.torchmb.moved import MovedNameError
from dualtrain_torch.compat.torchmb.tests import test_batched_model, test_model_batching
from dualtrain_torch.compat.torchmb.utils import (
    BATCH_MODULES,
    register_batch_module,
    register_module,
    to_batch_func,
)

__all__ = [
    "BATCH_MODULES",
    "AbstractBatchAdapter",
    "AbstractBatchModule",
    "BatchBatchNorm2d",
    "BatchConv2d",
    "BatchGroupNorm",
    "BatchLinear",
    "BatchModule",
    "MovedNameError",
    "batch_accuracy",
    "batch_loss",
    "batch_topk",
    "inner_batch_size",
    "merge_batch",
    "register_batch_module",
    "register_module",
    "split_batch",
    "test_batched_model",
    "test_model_batching",
    "to_batch_func",
]
