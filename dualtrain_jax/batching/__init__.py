"""Model batching under JAX: N models of one architecture trained as one module.

`module` holds `BatchModule` and its JAX hooks; `run` the execution strategies, `probe` the
isolation probe, `members` the per-member state, `optim` `member_optimizer`, `loss`
`batch_loss` and `batch_topk` (docs/batching.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualtrain.deprecation import moved_names

if TYPE_CHECKING:
    from dualtrain_jax.batching.module import BatchModule, batch_loss, batch_topk

__all__ = ["BatchModule", "batch_loss", "batch_topk"]

# Importing the package loads none of its modules (a submodule such as `optim` or `cache`
# comes alone): its names load `module` on first use; the rest of the old flat module's
# names are served at the old path with a DeprecationWarning.
__getattr__ = moved_names(__name__, "dualtrain_jax.batching.module", current=__all__)
