"""`TrainingLearner`: nebulgym's class for JAX, a whole train step through the verified ladder.

The step (forward in training mode, loss, gradients, the optax update) is one pure function
of ``(params, state, opt_state, inputs, targets, rng)`` accelerated as one
(`dualtrain_jax.compilation.AcceleratedFunction`): its JIT_DONATE rung donates the
parameters, the state and the optimizer state, which the step returns anew. The forward
(``learner(*inputs)``) runs the accelerated module (`AcceleratedModule`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dualtrain.accelerate.decisions import code_digest as digest, function_digest
from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import Explanation
from dualtrain.accelerate.rungs import DEFAULTS
from dualtrain.craft import Craft
from dualtrain.errors import bad_argument
from dualtrain_jax.compilation import (
    AcceleratedFunction,
    AcceleratedModule,
    accelerate,
)
from dualtrain_jax.compilation.keys import module_parts
from dualtrain_jax.compilation.probe import copy_tree
from dualtrain_jax.craft import JaxModule

__all__ = ["TrainingLearner", "cross_entropy"]

_RNG_SEED = 0  # the learner's own dropout keys: fold_in(key(0), step number)


def cross_entropy(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    """The default loss: mean softmax cross-entropy of logits against integer labels."""
    return optax.softmax_cross_entropy_with_integer_labels(outputs, targets).mean()


def train_step(
    shell: JaxModule,
    loss_fn: Callable[[Any, Any], Any],
    optimizer: optax.GradientTransformation,
) -> Callable[..., Any]:
    """The pure train step of `shell` (a plain or top-k patched module).

    ``step(params, state, opt_state, inputs, targets, rng) -> (params, state, opt_state,
    loss)``: forward in training mode, loss, gradients, the optimizer's update.
    """

    def step(
        params: Any, state: Any, opt_state: Any, inputs: tuple[Any, ...], targets: Any, rng: Any
    ) -> tuple[Any, Any, Any, Any]:
        def loss(p: Any) -> tuple[Any, Any]:
            out, new_state = shell.apply(p, state, *inputs, train=True, rng=rng)
            value = loss_fn(out, targets)
            if isinstance(value, (tuple, list, dict)) or jnp.shape(value) != ():
                # jax.grad's own message names neither the loss nor the way out
                got = type(value).__name__
                if not isinstance(value, (tuple, list, dict)):
                    got += f" of shape {jnp.shape(value)}"
                raise bad_argument(
                    "loss_fn",
                    loss_fn,
                    f"a function returning a scalar loss, not a {got} (for a (loss, aux) "
                    "pair pass lambda outputs, targets: loss_fn(outputs, targets)[0])",
                )
            return value, new_state

        (value, new_state), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state, opt_state, value

    return step


class TrainingLearner:
    """A model, a loss and an optimizer whose train step runs the fastest verified rung.

    Args:
        model: a realized `JaxModule` (an `AcceleratedModule` is re-accelerated with these
            arguments). ``learner.model`` is an `AcceleratedModule` holding a copy of its
            arrays, which the steps update (a JaxModule: TimeMachine and ``replace`` take
            it); `model` itself is left as it was.
        backends: rung names among "JIT_DONATE", "JIT", "EAGER" (None: all three).
        loss_fn: ``loss_fn(outputs, targets) -> scalar``; default `cross_entropy`.
        optimizer: an optax ``GradientTransformation``; needed by `step` only.
        patch_backprop: meProp top-k backprop through every Dense (approximate; `explain`
            lists it).
        **options: `LadderOptions` fields (rtol, atol, compile_budget, warm_steps,
            min_speedup, max_signatures, cache, clock).

    Donation: when JIT_DONATE serves the step, ``learner.model.params``, ``.state`` and
    ``learner.opt_state`` as they were before a step are deleted by it (the learner holds
    the new ones). Copy an array (``jnp.copy``) to keep it across steps.

    Raises:
        ArgumentError: not a realized module, a loss that is not callable, an optimizer
            that is not an optax GradientTransformation, an unknown rung or option.
    """

    def __init__(
        self,
        model: Any,
        backends: Any = DEFAULTS["jax"],
        *,
        loss_fn: Callable[[Any, Any], Any] | None = None,
        optimizer: optax.GradientTransformation | None = None,
        patch_backprop: bool = False,
        **options: Any,
    ) -> None:
        if isinstance(model, Craft):
            raise bad_argument(
                "model", model, "a realized module: dualtrain_jax.realize(craft, seed=...) first"
            )
        if not isinstance(model, JaxModule):
            raise bad_argument("model", model, "a realized dualtrain_jax module (JaxModule)")
        if loss_fn is not None and not callable(loss_fn):
            raise bad_argument("loss_fn", loss_fn, "None or a callable loss_fn(outputs, targets)")
        if optimizer is not None and not (
            callable(getattr(optimizer, "init", None))
            and callable(getattr(optimizer, "update", None))
        ):
            raise bad_argument("optimizer", optimizer, "None or an optax GradientTransformation")
        ladder = LadderOptions.from_keywords(options)
        if isinstance(model, AcceleratedModule):
            model = model.unwrap()
        # The learner's own arrays: its steps may donate them, never the caller's.
        model = model.replace(params=copy_tree(model.params), state=copy_tree(model.state))
        self.model: AcceleratedModule = accelerate(model, backends, patch_backprop, **options)
        self.loss_fn = cross_entropy if loss_fn is None else loss_fn
        self.optimizer = optimizer
        self.opt_state: Any = None if optimizer is None else optimizer.init(self.model.params)
        self.steps = 0  # steps taken; the default dropout key of step n is fold_in(key(0), n)
        self._step: AcceleratedFunction | None = None
        if optimizer is not None:
            shell = self.model.accelerator.shell
            self._step = AcceleratedFunction(
                train_step(shell, self.loss_fn, optimizer),
                self.model.accelerator.decider.backends,
                ladder,
                mode="step",
                key_parts={
                    "model": module_parts(shell),
                    "loss_fn": function_digest(self.loss_fn),
                    "optimizer": digest(optimizer),
                },
            )

    def __call__(self, *inputs: Any, rng: jax.Array | None = None) -> Any:
        """The accelerated forward in the model's mode (training mode updates its state)."""
        return self.model(*inputs, rng=rng)

    def step(self, inputs: Any, targets: Any, *, rng: jax.Array | None = None) -> jax.Array:
        """One train step: forward (training mode), loss, gradients, optimizer update.

        Args:
            inputs: the model's input, or a tuple of its inputs.
            targets: what `loss_fn` compares the outputs with.
            rng: the dropout key; default ``fold_in(key(0), learner.steps)``.

        Returns:
            The loss before the update, a scalar JAX array.

        Raises:
            ArgumentError: the learner has no optimizer.
        """
        if self._step is None:
            raise bad_argument(
                "optimizer",
                None,
                "an optax GradientTransformation (TrainingLearner(..., "
                "optimizer=optax.sgd(0.1))) to take steps",
            )
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        if rng is None:
            rng = jax.random.fold_in(jax.random.key(_RNG_SEED), self.steps)
        model = self.model
        params, state, self.opt_state, loss = self._step(
            model.params, model.state, self.opt_state, inputs, targets, rng
        )
        model.params, model.state = params, state
        self.steps += 1
        return loss

    def explain(self) -> Explanation:
        """The forward's decisions (modes "train"/"eval") and the step's (mode "step")."""
        forward = self.model.explain()
        decisions = list(forward.decisions)
        if self._step is not None:
            decisions += self._step.explain().decisions
        return Explanation(forward.backends, decisions, forward.approximations)

    def __repr__(self) -> str:
        return f"TrainingLearner({self.model!r}, steps={self.steps})"
