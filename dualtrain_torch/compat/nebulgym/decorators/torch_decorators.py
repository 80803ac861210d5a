"""nebulgym's class decorators: ``@accelerate_model(...)`` and ``@accelerate_dataset(...)``.

``accelerate_model(patch_backprop=True, **nebulgym_kwargs)`` takes nebulgym's arguments
(``backends``, ``logger``; ``extend`` is the decorator's own, as in nebulgym) and
dualtrain's ladder options, and accelerates every instance of the class when it is built
(`dualtrain_torch.accelerate_model`): the class stays the user's, hooks and ``state_dict``
keys are untouched, and ``model.forward.explain()`` says what runs. ``patch_backprop``
defaults to True, as in nebulgym 0.1.1: meProp's top-k backprop on every ``nn.Linear``,
approximate (named so by ``explain()``), k at least 1 (nebulgym's k of 0 left every layer
before a small head without gradient). ``accelerate_dataset(**nebuldata_kwargs)`` takes
`NebulDataset`'s arguments; an instance stays of its class and caches its items in memory
(`dualtrain.accelerate_dataset`), where nebulgym returned a NebulDataset in its place.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from dualtrain.errors import bad_argument
from dualtrain.preload import accelerate_dataset as _accelerate_dataset
from dualtrain_torch.compat.nebulgym.training_learners.base import (
    check_logger,
    log_decisions,
    no_backends,
)
from dualtrain_torch.compilation import accelerate_model as _accelerate_model

__all__ = ["accelerate_dataset", "accelerate_model", "model_decorator"]


def model_decorator(default_backprop: bool, patch_backprop: Any, kwargs: dict[str, Any]) -> Any:
    """The model decorator nebulgym's spellings share; `default_backprop` is their default.

    Args:
        default_backprop: what ``patch_backprop`` is when the decorator is used bare.
        patch_backprop: the first argument as given (or the class, used bare).
        kwargs: nebulgym's ``backends`` and ``logger``, and `LadderOptions` fields.
    """
    options = dict(kwargs)
    if "extend" in options:
        raise bad_argument(
            "extend",
            options["extend"],
            "left out: the decorator builds the model's learner with extend=False itself "
            "(nebulgym raised TypeError)",
        )
    backends = no_backends(options.pop("backends", None))
    logger = check_logger(options.pop("logger", None))
    target = None
    if isinstance(patch_backprop, (type, nn.Module)):  # used bare: @accelerate_model
        target, patch_backprop = patch_backprop, default_backprop
    decorator = _accelerate_model(patch_backprop, backends, **options)
    if logger is not None:
        decorator = _logging(decorator, logger)
    return decorator if target is None else decorator(target)


def _logging(decorator: Any, logger: Any) -> Any:
    """`decorator`, whose models also send their decisions to `logger`."""

    def decorate(target: Any) -> Any:
        result = decorator(target)
        if isinstance(target, nn.Module):
            log_decisions(target, logger)
            return result
        built = result.__init__

        @functools.wraps(built)  # keeps dualtrain's mark of the user's own __init__
        def init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
            built(self, *args, **kwargs)
            log_decisions(self, logger)

        result.__init__ = init
        return result

    return decorate


def accelerate_model(patch_backprop: Any = True, **nebulgym_kwargs: Any) -> Any:
    """Class decorator: each instance of the ``nn.Module`` class is accelerated when built.

    Args:
        patch_backprop: meProp's top-k backprop on the model's ``nn.Linear`` layers (True,
            nebulgym's default: approximate), False (exact), or dualtrain's
            ``{"k": ...}`` / ``{"ratio": ...}``.
        **nebulgym_kwargs: ``backends`` (`NebulgymBackend` members, strings or dualtrain's
            rungs; None or ``[]``: the default ladder), ``logger`` (a ``logging.Logger``
            for the decisions), and `dualtrain.accelerate.LadderOptions` fields.

    Raises:
        ArgumentError: a bad argument (``extend`` included), when the decorator is made.
    """
    return model_decorator(True, patch_backprop, nebulgym_kwargs)


def accelerate_dataset(cls: Any = None, /, **nebuldata_kwargs: Any) -> Any:
    """Class decorator: each instance of the dataset class caches its items, loads ahead.

    Args:
        cls: the class, when used bare (``@accelerate_dataset``; nebulgym needed the
            parentheses).
        **nebuldata_kwargs: `NebulDataset`'s ``preloaded_data`` (items loaded ahead) and
            ``max_memory_size`` (bytes; None: a quarter of the memory available), and
            `dualtrain.Preloader`'s keywords (threads, copy, sizeof, pin_memory).
    """
    return _accelerate_dataset(cls, **nebuldata_kwargs)
