"""The compile ladder under torch (docs/acceleration.md).

`accelerated` holds `accelerate` and `accelerate_model`; `module` the per-call dispatch
(`AcceleratedForward`); `rungs` the rungs; `probe` the trial snapshot and undo; `keys` the
call signatures; `learner` the training learner.
"""

from dualtrain_torch.compilation.accelerated import (
    AcceleratedForward,
    accelerate,
    accelerate_model,
    explain,
    patch_torch_module,
)

__all__ = ["AcceleratedForward", "accelerate", "accelerate_model", "explain", "patch_torch_module"]
