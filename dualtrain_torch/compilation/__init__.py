"""The compile ladder under torch (docs/acceleration.md).

`accelerated` holds `accelerate` and `accelerate_model`; `module` the per-call dispatch
(`AcceleratedForward`); `rungs` the rungs; `probe` the trial snapshot and undo; `keys` the
call signatures; `learner` the training learner; `cache` TorchInductor's compiled programs
kept beside the ladder's verdicts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualtrain.deprecation import moved_names

if TYPE_CHECKING:
    from dualtrain_torch.compilation.accelerated import (
        AcceleratedForward,
        accelerate,
        accelerate_model,
        explain,
        patch_torch_module,
    )

__all__ = ["AcceleratedForward", "accelerate", "accelerate_model", "explain", "patch_torch_module"]

# Importing the package loads none of its modules (a submodule such as `optim` or `cache`
# comes alone): its names load `accelerated` on first use; the rest of the old flat module's
# names are served at the old path with a DeprecationWarning.
__getattr__ = moved_names(__name__, "dualtrain_torch.compilation.accelerated", current=__all__)
