"""nebulgym's ``TrainingLearner(model, backends=None, logger=None, extend=True)``.

It is `dualtrain_torch.TrainingLearner` (the model's forward on dualtrain's verified ladder,
plus ``step``) taking nebulgym's four arguments by position. ``backends`` are nebulgym's
names (`NebulgymBackend` members or their strings) or dualtrain's rungs; None or an empty
list means the default ladder, which starts on eager PyTorch and moves to a faster rung
only once verified against it (nebulgym's default traced with TorchScript). ``logger``
receives the ladder's decisions (INFO) and run-time fallbacks (WARNING), where nebulgym
sent its backend failures. ``extend`` keeps nebulgym's meaning: True, the learner's
``train()``/``eval()`` set the model's mode and the model's attributes are read through
the learner; False (how nebulgym's decorators built it), neither.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dualtrain.accelerate.dispatch import Decider
from dualtrain.errors import bad_argument
from dualtrain_torch.compilation.learner import TrainingLearner as _Learner
from dualtrain_torch.compilation.module import AcceleratedForward

__all__ = ["TrainingLearner", "check_logger", "log_decisions"]


def check_logger(logger: Any) -> logging.Logger | None:
    """`logger` if it is None or logger-like (``info`` and ``warning`` methods)."""
    if logger is not None and not (
        callable(getattr(logger, "info", None)) and callable(getattr(logger, "warning", None))
    ):
        raise bad_argument("logger", logger, "None or a logging.Logger")
    return logger


def no_backends(backends: Any) -> Any:
    """None for an empty list of backends, which nebulgym read as its default."""
    if isinstance(backends, (list, tuple)) and not backends:
        return None
    return backends


class _Reporter:
    """Logs what a Decider decided since the last look: new decisions and new events."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._seen: dict[tuple[str, str], int] = {}  # decision key -> events logged

    def report(self, decider: Decider) -> None:
        for key, decision in list(decider.decisions.items()):
            logged = self._seen.get(key)
            if logged is None:
                self.logger.info(
                    "dualtrain.accelerate: %s (%s): %s", decision.mode, key[1], decision.chosen
                )
                logged = 0
            for event in decision.events[logged:]:
                level = logging.WARNING if "failed" in event else logging.INFO
                self.logger.log(level, "dualtrain.accelerate: %s: %s", decision.mode, event)
            self._seen[key] = len(decision.events)


class _LogHook:
    """A forward hook reporting its module's forward decisions (picklable, as the module)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.reporter = _Reporter(logger)

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        forward = module.__dict__.get("forward")
        if isinstance(forward, AcceleratedForward):
            self.reporter.report(forward.decider)


def log_decisions(module: nn.Module, logger: logging.Logger) -> None:
    """Sends `module`'s forward decisions to `logger` after each call (once per logger)."""
    hooks = [h for h in module._forward_hooks.values() if isinstance(h, _LogHook)]
    if any(h.reporter.logger is logger for h in hooks):
        return
    module.register_forward_hook(_LogHook(logger))


class TrainingLearner(_Learner):
    """nebulgym's TrainingLearner on `dualtrain_torch.TrainingLearner`.

    Args:
        model: the ``nn.Module`` (accelerated in place, `dualtrain_torch.accelerate`).
        backends: `NebulgymBackend` members, their strings or dualtrain's rung names, in
            order of preference; None or ``[]``: dualtrain's default ladder.
        logger: None, or a ``logging.Logger`` that gets the decisions and fallbacks.
        extend: True (nebulgym's default): ``train()``/``eval()`` set the model's mode and
            ``learner.name`` reads ``model.name``. False: neither (nebulgym's decorators).
        loss_fn, optimizer, patch_backprop, **options: dualtrain's (keyword-only), see
            `dualtrain_torch.TrainingLearner`.

    Raises:
        ArgumentError: a bad argument, named with its value and what it must be.
    """

    def __init__(
        self,
        model: nn.Module,
        backends: Sequence[Any] | str | None = None,
        logger: logging.Logger | None = None,
        extend: bool = True,
        *,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        patch_backprop: bool | dict[str, Any] = False,
        **options: Any,
    ) -> None:
        logger = check_logger(logger)
        if not isinstance(extend, bool):
            raise bad_argument("extend", extend, "True or False")
        self._extend, self.logger = extend, logger
        super().__init__(
            model,
            no_backends(backends),
            loss_fn=loss_fn,
            optimizer=optimizer,
            patch_backprop=patch_backprop,
            **options,
        )
        self._reporter = None if logger is None else _Reporter(logger)
        if logger is not None:
            log_decisions(self.model, logger)

    @property
    def extend(self) -> bool:
        """The ``extend`` given (nebulgym's)."""
        return self._extend

    def train(self, mode: bool = True) -> TrainingLearner:
        """``model.train(mode)`` when ``extend`` (else the model's mode is left alone)."""
        if self._extend:
            super().train(mode)
        return self

    def eval(self) -> TrainingLearner:
        """``model.eval()`` when ``extend`` (else the model's mode is left alone)."""
        if self._extend:
            super().eval()
        return self

    def step(self, inputs: Any, targets: Any) -> torch.Tensor:
        """`dualtrain_torch.TrainingLearner.step`; the step's decisions go to the logger too."""
        loss = super().step(inputs, targets)
        if self._reporter is not None:
            self._reporter.report(self.step_decider)
        return loss

    def __getattr__(self, name: str) -> Any:
        # Only for names the learner lacks. nebulgym read them on the model when extend.
        model = self.__dict__.get("model")
        if name.startswith("__") or model is None:
            raise AttributeError(name)
        if not self.__dict__.get("_extend", False):
            raise AttributeError(
                f"TrainingLearner has no attribute {name!r}: with extend=False the model's "
                f"attributes are not read through the learner; use learner.model.{name}"
            )
        return getattr(model, name)
