"""The compile ladder under torch (docs/acceleration.md).

`accelerated` holds `accelerate` and `accelerate_model`; `module` the per-call dispatch
(`AcceleratedForward`); `rungs` the rungs; `probe` the trial snapshot and undo; `keys` the
call signatures; `learner` the training learner.
"""

from dualtrain.deprecation import moved_names
from dualtrain_torch.compilation.accelerated import (
    AcceleratedForward,
    accelerate,
    accelerate_model,
    explain,
    patch_torch_module,
)

__all__ = ["AcceleratedForward", "accelerate", "accelerate_model", "explain", "patch_torch_module"]

# The rest of the old flat module's names, at its old path, with a DeprecationWarning.
__getattr__ = moved_names(__name__, "dualtrain_torch.compilation.accelerated")
