"""The compile ladder under JAX (docs/acceleration.md).

`accelerated` holds `accelerate`, `accelerate_model` and `AcceleratedFunction`; `module` the
realized-module form; `rungs` the rungs; `probe` the side-effect-free trials; `keys` the call
signatures; `learner` the training learner; `cache` XLA's compiled programs on disk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualtrain.deprecation import moved_names

if TYPE_CHECKING:
    from dualtrain_jax.compilation.accelerated import (
        AcceleratedFunction,
        AcceleratedModule,
        accelerate,
        accelerate_model,
    )

__all__ = ["AcceleratedFunction", "AcceleratedModule", "accelerate", "accelerate_model"]

# Importing the package loads none of its modules (a submodule such as `optim` or `cache`
# comes alone): its names load `accelerated` on first use; the rest of the old flat module's
# names are served at the old path with a DeprecationWarning.
__getattr__ = moved_names(__name__, "dualtrain_jax.compilation.accelerated", current=__all__)
