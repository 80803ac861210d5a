"""nebulgym's TrainingLearner: a model, its accelerated forward, and a whole training step.

``learner(x)`` runs the model (its forward accelerated by `accelerate`); ``learner.step(x,
y)`` runs one training step (zero the gradients, forward, loss, backward, optimizer step) and
climbs a ladder of its own over the step: "COMPILED_STEP" compiles the whole step function
(forward, backward and the optimizer's update) with ``torch.compile``, "PYTORCH" runs it as
written. The step's trials start from one snapshot of parameters, gradients, buffers,
optimizer state and RNG and compare the loss and everything the step changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dualtrain.accelerate.decisions import function_digest
from dualtrain.accelerate.dispatch import Decider, Probation
from dualtrain.accelerate.ladder import UnavailableError
from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import Explanation
from dualtrain.errors import bad_argument
from dualtrain_torch.compilation import accelerate
from dualtrain_torch.compilation.keys import code, modes, signature, structure
from dualtrain_torch.compilation.module import AcceleratedForward
from dualtrain_torch.compilation.probe import Snapshot, host
from dualtrain_torch.compilation.rungs import compile_apart

__all__ = ["TrainingLearner"]

_STEP_RUNGS = ("COMPILED_STEP", "PYTORCH")


class _StepSnapshot:
    """What a step changes: the model, the optimizer and a loss that is a module.

    `Snapshot` covers the model and every parameter the optimizer holds; a loss module's
    own buffers and attributes (a running scale) are snapshotted apart.
    """

    def __init__(self, learner: TrainingLearner, attributes: bool = False) -> None:
        self._parts = [
            Snapshot(learner.model, learner.optimizer, params=True, attributes=attributes)
        ]
        if isinstance(learner.loss_fn, nn.Module):
            self._parts.append(Snapshot(learner.loss_fn, params=True, attributes=attributes))

    def restore(self) -> None:
        for part in reversed(self._parts):
            part.restore()


class _StepTrial:
    """One way to run the training step, for the ladder (see `dualtrain.accelerate.ladder`)."""

    def __init__(self, name: str, learner: TrainingLearner, inputs: tuple[Any, ...], targets: Any):
        self.name, self.learner = name, learner
        self.inputs, self.targets = inputs, targets
        self.clock = learner.step_decider.options.clock  # what the ladder times with
        self._runner: Callable[..., torch.Tensor] | None = None
        self._adopted = False
        self._snapshot = _StepSnapshot(learner, attributes=True)

    def adopt(self, runner: Callable[..., torch.Tensor]) -> None:
        """Serves `runner`, this rung's already built step (`build` then does nothing)."""
        self._runner, self._adopted = runner, True

    def build(self) -> None:
        if self._adopted:
            return
        plain = self.learner.plain_step
        if self.name == "PYTORCH":
            self._runner = plain
        elif self.name == "COMPILED_STEP":
            # fallback_random keeps dropout on torch's generator, as eager draws it.
            self._runner = compile_apart(plain, {"fallback_random": True})
        else:
            raise UnavailableError("a forward rung: the model's forward uses it inside the step")

    def runner(self) -> Callable[..., torch.Tensor]:
        assert self._runner is not None, "build() first"
        return self._runner

    def check(self) -> tuple[list[str], list[np.ndarray]]:
        run = self.runner()
        learner = self.learner
        try:
            loss = run(self.inputs, self.targets)
            names, results = ["loss"], [host(loss)]
            for name, param in learner.model.named_parameters():
                names.append(f"param:{name}")
                results.append(host(param))
            for name, b in learner.model.named_buffers():
                names.append(f"buffer:{name}")
                results.append(host(b))
            index: dict[Any, str] = {
                param: name for name, param in learner.model.named_parameters()
            }
            assert learner.optimizer is not None
            for p, entry in learner.optimizer.state.items():
                for key, value in sorted(entry.items()):
                    if isinstance(value, torch.Tensor):
                        names.append(f"state:{index.get(p, '?')}.{key}")
                        results.append(host(value))
            return names, results
        finally:
            self._snapshot.restore()

    def step(self) -> float:
        """One step; returns its seconds as a real `TrainingLearner.step` spends them.

        That is with the snapshot a non-plain rung takes first, without the trial's restoring.
        """
        run = self.runner()
        try:
            start = self.clock()
            if self.name != "PYTORCH":
                _StepSnapshot(self.learner, attributes=True)
            loss = run(self.inputs, self.targets)
            if loss.is_cuda:
                torch.cuda.synchronize(loss.device)
            return self.clock() - start
        finally:
            self._snapshot.restore()

    def release(self) -> None:
        self._runner = None


class TrainingLearner:
    """A model with an accelerated forward and an accelerated training step (nebulgym's class).

    Args:
        model: an ``nn.Module`` (accelerated in place, see `accelerate`).
        backends: rungs for the forward and the step; None: the forward's defaults plus
            COMPILED_STEP.
        loss_fn: ``loss_fn(outputs, targets) -> scalar tensor``; default
            ``torch.nn.functional.cross_entropy`` (integer class targets).
        optimizer: a ``torch.optim`` optimizer over the model's parameters (needed by
            `step`).
        patch_backprop: as in `accelerate` (approximate, opt-in).
        **options: `LadderOptions` fields.
    """

    def __init__(
        self,
        model: nn.Module,
        backends: Sequence[Any] | str | None = None,
        *,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        patch_backprop: bool | dict[str, Any] = False,
        **options: Any,
    ) -> None:
        from dualtrain.accelerate.rungs import DEFAULTS, parse_backends

        if not isinstance(model, nn.Module):
            raise bad_argument("model", model, "a torch.nn.Module instance")
        if loss_fn is not None and not callable(loss_fn):
            raise bad_argument("loss_fn", loss_fn, "a callable loss_fn(outputs, targets)")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise bad_argument("optimizer", optimizer, "a torch.optim.Optimizer or None")
        names = parse_backends(
            ("COMPILED_STEP", *DEFAULTS["torch"]) if backends is None else backends, "torch"
        )
        settings = LadderOptions.from_keywords(options)
        forward_names = [n for n in names if n != "COMPILED_STEP"]
        step_names = [n for n in _STEP_RUNGS if n in names or n == "PYTORCH"]
        current = model.__dict__.get("forward")
        if not patch_backprop and isinstance(current, AcceleratedForward):
            patch_backprop = current.patch_backprop  # a decorated class's setting stays
        self.model = accelerate(model, forward_names, patch_backprop, **options)
        self.loss_fn = nn.functional.cross_entropy if loss_fn is None else loss_fn
        self.optimizer = optimizer
        self.backends = names
        self._quick: dict[Any, str] = {}  # the forward's quick key -> the step's signature
        self.step_decider = Decider("torch", step_names, settings)

    # -- the model ---------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's (accelerated) forward in its current mode."""
        return self.model(*args, **kwargs)

    def train(self, mode: bool = True) -> TrainingLearner:
        """``model.train(mode)``; returns the learner."""
        self.model.train(mode)
        return self

    def eval(self) -> TrainingLearner:
        """``model.eval()``; returns the learner."""
        self.model.eval()
        return self

    @property
    def forward(self) -> AcceleratedForward:
        """The model's `AcceleratedForward` (its forward decisions)."""
        forward = self.model.__dict__["forward"]
        assert isinstance(forward, AcceleratedForward)
        return forward

    # -- the step ----------------------------------------------------------------------

    def plain_step(self, inputs: tuple[Any, ...], targets: Any) -> torch.Tensor:
        """One eager step: zero_grad, forward, loss, backward and the optimizer's step."""
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(*inputs), targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def step(self, inputs: Any, targets: Any) -> torch.Tensor:
        """One training step on a batch; returns the loss (a detached scalar tensor).

        A model in evaluation mode is put in training mode first (and stays there).

        Args:
            inputs: the model's input, or a tuple of its positional inputs.
            targets: what `loss_fn` compares the outputs with.
        """
        if self.optimizer is None:
            raise bad_argument("optimizer", None, "an optimizer given to TrainingLearner to step")
        if not self.model.training:
            self.model.train()
        batch = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        decider = self.step_decider
        # The forward's quick key (plain tensors by position) spares formatting the
        # signature on every step; other calls take the full signature.
        quick = self.forward._quick_key((*batch, targets), {})
        key = self._quick.get(quick) if quick is not None else None
        if key is None:
            key = signature(batch, {"targets": targets}) + modes(self.model)
            if quick is not None:
                if len(self._quick) >= 256:
                    self._quick.clear()
                self._quick[quick] = key
        runner = decider.known("step", key)
        if runner is None:
            runner = decider.decide(
                "step",
                key,
                {
                    **structure(self.model),
                    "optimizer": repr(self.optimizer),
                    "loss": getattr(self.loss_fn, "__qualname__", repr(self.loss_fn)),
                    "loss_code": code(self.loss_fn),
                    # a loss module's settings too (CrossEntropyLoss's label_smoothing is
                    # not in its repr)
                    "loss_state": function_digest(self.loss_fn),
                },
                lambda names: [_StepTrial(n, self, batch, targets) for n in names],
            )
        if type(runner) is Probation:  # what this step runs, after any climb that is due
            runner = runner.serving()
        if runner == self.plain_step or decider.serves_eager(runner):
            return runner(batch, targets)
        snapshot = _StepSnapshot(self, attributes=True)
        try:
            return runner(batch, targets)
        except Exception as error:
            snapshot.restore()
            loss = self.plain_step(batch, targets)
            decider.fall_back("step", key, error)
            return loss

    def explain(self) -> Explanation:
        """The forward's decisions and the step's, and what is approximate."""
        forward = self.forward.explain()
        step = self.step_decider.explain()
        return Explanation(
            self.backends, forward.decisions + step.decisions, forward.approximations
        )
