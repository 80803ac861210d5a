"""nebulgym's first decorators (its technical README): ``nebulgym.annotations.torch_annotations``.

``@patch_torch_module(patch_backprop=False, **nebulgym_kwargs)`` and
``@patch_dataset(**nebuldata_kwargs)``, renamed ``nebulgym_model`` / ``nebulgym_dataset``
on 2022-06-07 and ``accelerate_model`` / ``accelerate_dataset`` the same day. They are those
decorators (`dualtrain_torch.compat.nebulgym.decorators.torch_decorators`) with this
module's default: ``patch_backprop=False``, exact, as nebulgym had it then.
"""

from __future__ import annotations

from typing import Any

from dualtrain_torch.compat.nebulgym.decorators.torch_decorators import (
    accelerate_dataset,
    model_decorator,
)

__all__ = ["nebulgym_dataset", "nebulgym_model", "patch_dataset", "patch_torch_module"]


def patch_torch_module(patch_backprop: Any = False, **nebulgym_kwargs: Any) -> Any:
    """``accelerate_model`` with the technical README's default ``patch_backprop=False``.

    Args:
        patch_backprop: False (exact, the default then), True (meProp top-k backprop,
            approximate), or dualtrain's ``{"k": ...}`` / ``{"ratio": ...}``.
        **nebulgym_kwargs: ``backends``, ``logger`` and ladder options, as
            ``accelerate_model``'s.
    """
    return model_decorator(False, patch_backprop, nebulgym_kwargs)


def nebulgym_model(patch_backprop: Any = False, **nebulgym_kwargs: Any) -> Any:
    """The second name nebulgym gave `patch_torch_module` (same arguments, same default)."""
    return model_decorator(False, patch_backprop, nebulgym_kwargs)


def patch_dataset(cls: Any = None, /, **nebuldata_kwargs: Any) -> Any:
    """``accelerate_dataset`` under its first name (``preloaded_data``, ``max_memory_size``)."""
    return accelerate_dataset(cls, **nebuldata_kwargs)


def nebulgym_dataset(cls: Any = None, /, **nebuldata_kwargs: Any) -> Any:
    """``accelerate_dataset`` under its second name."""
    return accelerate_dataset(cls, **nebuldata_kwargs)
