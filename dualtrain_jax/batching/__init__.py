"""Model batching under JAX: N models of one architecture trained as one module.

`module` holds `BatchModule` and its JAX hooks; `run` the execution strategies, `probe` the
isolation probe, `members` the per-member state, `optim` `member_optimizer`, `loss`
`batch_loss` and `batch_topk` (docs/batching.md).
"""

from dualtrain.deprecation import moved_names
from dualtrain_jax.batching.module import BatchModule, batch_loss, batch_topk

__all__ = ["BatchModule", "batch_loss", "batch_topk"]

# The rest of the old flat module's names, at its old path, with a DeprecationWarning.
__getattr__ = moved_names(__name__, "dualtrain_jax.batching.module")
