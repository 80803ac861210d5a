"""nebulgym's module layout on dualtrain: migrating is a change of the import prefix.

``from nebulgym.decorators.torch_decorators import accelerate_model`` becomes
``from dualtrain_torch.compat.nebulgym.decorators.torch_decorators import accelerate_model``,
and so for every module nebulgym had, its technical README's ``annotations`` included:

- ``base``: ``NebulgymBackend``;
- ``decorators.torch_decorators``: ``accelerate_model``, ``accelerate_dataset``;
- ``decorators.helpers``: ``suppress_warnings``, ``suppress_stdout``;
- ``annotations.torch_annotations``: ``patch_torch_module``, ``patch_dataset``,
  ``nebulgym_model``, ``nebulgym_dataset``;
- ``data.base``, ``data.nebuly_dataset``, ``data.bagua_dataset``: ``BaseDataset``,
  ``NebulDataset``, ``BaguaDataset``;
- ``patches.pytorch.meprop_linear``: ``patch_backward_pass``, ``MePropLinear``,
  ``me_prop_linear``, ``MePropLinearFunction``;
- ``training_learners.base``: ``TrainingLearner``;
- ``training_learners.model_engines`` (and its ``base``, ``torch_engine``, ``ort_engine``,
  ``rammer_engine``): ``ENGINE_MAP``, ``BaseEngine``, ``TorchEngine``,
  ``TorchScriptEngine``, ``ORTEngine``, ``RammerEngine``.

Each name takes nebulgym's arguments in nebulgym's order with nebulgym's defaults and runs
on dualtrain's implementation: `dualtrain_torch.accelerate` (the verified compile ladder),
`dualtrain_torch.TrainingLearner`, `dualtrain.Preloader` and
`dualtrain_torch.sparse_backprop` (meProp, k at least 1). Internals with no dualtrain
counterpart (``WindowLoader``, ``CallMethodFixingEnvRunner``, ``ATTRIBUTE_NAME``) raise
`RetiredError` when imported, saying what to use. This package imports its submodules
only when asked, as nebulgym's empty ``__init__`` did.
"""

from __future__ import annotations

from dualtrain.compat.retired import RetiredError

__all__ = ["RetiredError"]
