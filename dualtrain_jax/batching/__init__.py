"""Model batching under JAX: N models of one architecture trained as one module.

`module` holds `BatchModule` and its JAX hooks; `run` the execution strategies, `probe` the
isolation probe, `members` the per-member state, `optim` `member_optimizer`, `loss`
`batch_loss` and `batch_topk` (docs/batching.md).
"""

from dualtrain_jax.batching.module import BatchModule, batch_loss, batch_topk

__all__ = ["BatchModule", "batch_loss", "batch_topk"]
