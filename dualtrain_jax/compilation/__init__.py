"""The compile ladder under JAX (docs/acceleration.md).

`accelerated` holds `accelerate`, `accelerate_model` and `AcceleratedFunction`; `module` the
realized-module form; `rungs` the rungs; `probe` the side-effect-free trials; `keys` the call
signatures; `learner` the training learner; `cache` XLA's compiled programs on disk.
"""

from dualtrain.deprecation import moved_names
from dualtrain_jax.compilation.accelerated import (
    AcceleratedFunction,
    AcceleratedModule,
    accelerate,
    accelerate_model,
)

__all__ = ["AcceleratedFunction", "AcceleratedModule", "accelerate", "accelerate_model"]

# The rest of the old flat module's names, at its old path, with a DeprecationWarning.
__getattr__ = moved_names(__name__, "dualtrain_jax.compilation.accelerated")
