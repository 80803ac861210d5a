"""`DataParallelLearner`: one train step over a JAX mesh, its loss the global batch's mean.

Two engines run the same step. "jit" (default): one ``jax.jit`` over the global batch with
the parameters replicated (``P()``) and the batch split by rows (``P("data")``); XLA
partitions it and inserts the all-reduce, so the step is the single-device step on the whole
batch (BatchNorm's statistics too: they are the global batch's). "pmap": ``jax.pmap`` over
this process's mesh devices, each device its rows, the gradients and the loss summed with
``lax.psum`` over the axis "data"; the learner's `model` and `opt_state` come back in the jit
form (global arrays replicated over the mesh) under both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dualtrain.craft import Craft
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_jax.craft import JaxModule
from dualtrain_jax.distributed.rows import (
    AXIS,
    Joined,
    PmapLayout,
    batch_rows,
    host_rows,
    mean_floats,
    place,
)
from dualtrain_jax.transfer import Transfer

__all__ = ["DataParallelLearner", "per_sample_cross_entropy"]

ENGINES = ("jit", "pmap")
_RNG_SEED = 0  # the default dropout key of step n: fold_in(key(0), n), as TrainingLearner's


def per_sample_cross_entropy(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    """The default loss: softmax cross-entropy of logits ``(B, C)`` against labels ``(B,)``.

    Returns the per-sample losses ``(B,)`` (the learner averages them, with the mask).
    """
    return optax.softmax_cross_entropy_with_integer_labels(outputs, targets)


class DataParallelLearner:
    """A model, an optax optimizer and a loss, stepped data-parallel over a runtime's mesh.

    Two kinds of model:

    - a realized module (`dualtrain_jax.realize`): each step runs ``apply(params, state,
      *inputs, train=True, rng=...)`` and keeps the new state (BatchNorm statistics), as
      `dualtrain_jax.TrainingLearner` does; ``loss_fn(outputs, targets)``, default per-sample
      cross-entropy on integer labels.
    - a pytree of parameter arrays: ``loss_fn(params, inputs, targets)`` (required) is the
      whole model; `inputs` is passed as given (one array or a tuple).

    Either loss returns per-sample losses ``(B,)`` over the batch's rows or their mean (a
    scalar; not with a mask). The step's loss and gradient are those of the mean over the
    global batch: every process's rows, or with ``mask`` the rows it marks True.

    Args:
        runtime: the joined run (`dualtrain_jax.distributed.rows.Joined`).
        model: a realized module or a pytree of arrays (copied onto the mesh, replicated;
            the caller's arrays are left as they are).
        optimizer: an optax ``GradientTransformation``.
        loss_fn: see above; None: the default (modules only).
        engine: "jit" (sharded jit) or "pmap".

    Attributes:
        model: the module (same mode) or params pytree, arrays replicated over the mesh.
        opt_state: the optimizer's state, replicated likewise.
        steps: steps taken.
        engine: "jit" or "pmap".

    Raises:
        ArgumentError: a bad engine, optimizer or loss_fn, an unrealized Craft.
    """

    def __init__(
        self,
        runtime: Joined,
        model: Any,
        optimizer: Any,
        loss_fn: Callable[..., Any] | None,
        engine: str,
    ) -> None:
        if engine not in ENGINES:
            raise bad_argument("engine", engine, "'jit' (sharded jit) or 'pmap'")
        if not all(callable(getattr(optimizer, name, None)) for name in ("init", "update")):
            raise bad_argument("optimizer", optimizer, "an optax GradientTransformation")
        if isinstance(model, Craft):
            raise bad_argument(
                "model", model, "a realized module: dualtrain_jax.realize(craft, seed=...) first"
            )
        if loss_fn is not None and not callable(loss_fn):
            raise bad_argument("loss_fn", loss_fn, "None or a callable loss")
        self.runtime, self.optimizer, self.engine = runtime, optimizer, engine
        self._module: JaxModule | None = None
        if isinstance(model, JaxModule):
            # An AcceleratedModule: the step is compiled whole, no ladder inside it. (Its
            # module is not imported here: importing it starts JAX's backend, which must wait
            # for jax.distributed.initialize.)
            unwrap = getattr(model, "unwrap", None)
            if callable(unwrap):
                model = unwrap()
            self._module = model
            shell = model.replace(params={}, state={})
            fn = per_sample_cross_entropy if loss_fn is None else loss_fn

            def forward(params: Any, state: Any, inputs: Any, targets: Any, rng: Any) -> Any:
                out, new_state = shell.apply(params, state, *inputs, train=True, rng=rng)
                return fn(out, targets), new_state

            params, state = model.params, model.state
        else:
            if loss_fn is None:
                raise bad_argument(
                    "loss_fn",
                    None,
                    "loss_fn(params, inputs, targets) when the model is a pytree of arrays "
                    "(a realized module has a default)",
                )
            fn = loss_fn

            def forward(params: Any, state: Any, inputs: Any, targets: Any, rng: Any) -> Any:
                return fn(params, inputs, targets), state

            params, state = model, {}
        self.loss_fn = fn
        self._forward = forward
        params, state = runtime.replicate((params, state))
        opt_state = jax.jit(optimizer.init, out_shardings=runtime.replicated)(params)
        self._plain: tuple[Any, Any, Any] | None = (params, state, opt_state)
        self._stacked: tuple[Any, Any, Any] | None = None  # pmap's per-device copies
        self._transfer = Transfer(runtime.batched)
        self._pmap = PmapLayout(runtime)
        self._steps: dict[Any, Any] = {}
        self._view: tuple[Any, Any, Any] | None = None  # the module `model` last handed out
        self.steps = 0

    def __repr__(self) -> str:
        return f"DataParallelLearner(engine={self.engine!r}, steps={self.steps}, {self.runtime!r})"

    # ---- what the learner holds, in the jit form under both engines -------------------------

    def _jit_form(self) -> tuple[Any, Any, Any]:
        if self._plain is None:
            assert self._stacked is not None
            if self.runtime.processes == 1:
                self._plain = self._pmap.first(self._stacked)  # device 0's copy, on the devices
            else:
                first = jax.tree.map(lambda x: host_rows(x)[0], self._stacked)
                self._plain = self.runtime.replicate(first, broadcast=False)
        return self._plain

    @property
    def model(self) -> Any:
        """The module (its mode kept) or params pytree, arrays replicated over the mesh.

        Assigning a module (or pytree) of the same structure and shapes replaces the
        learner's (process 0's values, replicated). A checkpoint loaded into the module this
        returns (``TimeMachine.to(learner.model)``, which gives it new arrays) is taken up
        by the learner at its next step or read, as torch's learner is loaded in place.
        """
        self._adopt()
        params, state, _ = self._jit_form()
        if self._module is None:
            return params
        view = self._module.replace(params=params, state=state)
        self._view = (view, view.params, view.state)
        return view

    @model.setter
    def model(self, model: Any) -> None:
        if self._module is not None:
            if not isinstance(model, JaxModule):
                raise bad_argument("model", model, "a realized module like the learner's")
            given: Any = (model.params, model.state)
        else:
            given = (model, {})
        params, state, opt_state = self._jit_form()
        params, state = self._replicated_like("model", given, (params, state))
        self._plain, self._stacked, self._view = (params, state, opt_state), None, None

    @property
    def opt_state(self) -> Any:
        """The optimizer's state, replicated over the mesh.

        Assigning a state of the same structure and shapes (``TimeMachine.to(...,
        optimizer=learner.opt_state).optimizer``, say) resumes the optimizer from it.
        """
        self._adopt()
        return self._jit_form()[2]

    @opt_state.setter
    def opt_state(self, opt_state: Any) -> None:
        self._adopt()
        params, state, current = self._jit_form()
        opt_state = self._replicated_like("opt_state", opt_state, current)
        self._plain, self._stacked = (params, state, opt_state), None

    def _adopt(self) -> None:
        """Takes up arrays loaded into the module `model` handed out since the last step."""
        if self._view is None:
            return
        view, params, state = self._view
        if view.params is not params or view.state is not state:
            self.model = view

    def _replicated_like(self, name: str, tree: Any, like: Any) -> Any:
        """`tree` checked against `like` (structure, shapes) and replicated in its dtypes."""
        leaves, treedef = jax.tree.flatten(tree)
        want, want_def = jax.tree.flatten(like)
        if str(treedef) != str(want_def):  # (PyTreeDef has no typed ==)
            raise ArgumentError(
                f"{name} must have the learner's structure {_short(want_def)}; got "
                f"{_short(treedef)}"
            )
        for (path, got), ref in zip(
            jax.tree_util.tree_flatten_with_path(tree)[0], want, strict=True
        ):
            if tuple(np.shape(got)) != tuple(ref.shape):
                raise ArgumentError(
                    f"{name} must have the learner's shapes: {tuple(ref.shape)} at "
                    f"{jax.tree_util.keystr(path)}; got {tuple(np.shape(got))}"
                )
        host = [
            np.asarray(host_rows(x), dtype=ref.dtype) for x, ref in zip(leaves, want, strict=True)
        ]
        return self.runtime.replicate(jax.tree.unflatten(treedef, host))

    # ---- the step -----------------------------------------------------------------------

    def step(
        self, inputs: Any, targets: Any, mask: Any = None, *, rng: jax.Array | None = None
    ) -> jax.Array:
        """One train step on the global batch: forward, mean loss, gradients, update.

        Args:
            inputs: this process's rows, ``(b, ...)`` (or a tuple of such arrays): NumPy,
                JAX, or a Tank's batch already sharded over the mesh. The global batch is
                every process's rows in rank order, ``B = processes * b`` rows, a multiple
                of the mesh size `nworld`.
            targets: what the loss compares outputs with, rows likewise.
            mask: None, or booleans ``(b,)``: rows marked False (a padded last batch) count
                for nothing; the loss is the mean over the True rows of all processes.
            rng: the dropout key; default ``fold_in(key(0), learner.steps)``.

        Returns:
            The loss before the update, a scalar replicated over the mesh (``float(loss)``
            reads it on any process).

        Raises:
            ArgumentError: rows that do not split over the mesh; a loss of another shape than
                ``()`` or ``(B,)``; a scalar loss with a mask.
        """
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((inputs, targets, mask))):
            raise ArgumentError(
                "learner.step compiles and runs its own sharded step and keeps the new "
                "parameters: call it outside jax.jit, jax.vmap and other transformations; "
                "got traced inputs"
            )
        if self._module is not None:  # apply(params, state, *inputs)
            inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        rows = batch_rows(targets)
        if mask is not None:
            # A list of booleans is one mask, not a pytree of scalars.
            mask = mask if isinstance(mask, (np.ndarray, jax.Array)) else np.asarray(mask)
            if tuple(mask.shape) != (rows,):
                # (B, 1) would broadcast against the per-sample losses (B,): a wrong loss.
                raise bad_argument(
                    "mask", mask, f"booleans of shape ({rows},), one per row of targets"
                )
        masked = mask is not None
        self._adopt()
        key: np.ndarray
        if self.engine == "jit":
            if rng is None:  # the step derives fold_in(key(0), steps) itself: no op outside
                impl, key = None, np.asarray(self.steps % 2**32, np.uint32)
            else:
                impl, key = _key_data(rng)  # raw uint32: crosses any sharding
            loss = self._jit_step(inputs, targets, mask, (masked, impl), key)
        else:
            if rng is None:
                rng = jax.random.fold_in(jax.random.key(_RNG_SEED), self.steps)
            impl, key = _key_data(rng)
            loss = self._pmap_step(inputs, targets, mask, (masked, impl), key)
        self.steps += 1
        self.runtime.on_step()
        return loss

    def _mean(self, value: Any, mask: Any, rows: int, count: Any) -> Any:
        """The loss over these rows, divided by `count` (the global rows counted)."""
        shape = jnp.shape(value)
        if shape == () and mask is None:
            return value
        if shape != (rows,):
            got = "a scalar with a mask" if shape == () else f"shape {shape}"
            raise bad_argument(
                "loss_fn",
                self.loss_fn,
                f"a loss returning per-sample losses ({rows},) or (without a mask) their "
                f"mean; got {got}",
            )
        if mask is not None:
            value = jnp.where(mask, value, 0)
        return value.sum() / count

    def _build_step(self, impl: str | None, axis: str | None) -> Callable[..., Any]:
        """The step both engines compile (one body, so jit and pmap cannot drift apart).

        Under pmap (`axis`) each device holds its rows: the row count, the gradients and the
        loss are summed over the axis and each device draws its own dropout key. Under jit,
        XLA does the same for the global batch. `impl` None: `key` is the step count and the
        dropout key is ``fold_in(key(0), count)``, derived inside the step.
        """
        forward, optimizer, mean = self._forward, self.optimizer, self._mean

        def step(params: Any, state: Any, opt_state: Any, batch: Any, key: Any) -> Any:
            inputs, targets, mask = (*batch, None)[:3]
            if impl is None:
                rng = jax.random.fold_in(jax.random.key(_RNG_SEED), key)
            else:
                rng = jax.random.wrap_key_data(key, impl=impl)
            rows = jax.tree.leaves(targets)[0].shape[0]
            mask = None if mask is None else mask.astype(bool)
            count = rows if mask is None else mask.sum()
            if axis is not None:
                rng = jax.random.fold_in(rng, jax.lax.axis_index(axis))
                count = jax.lax.psum(count, axis)
            count = jnp.maximum(count, 1)

            def objective(p: Any) -> Any:
                value, new_state = forward(p, state, inputs, targets, rng)
                if axis is not None and jnp.shape(value) == () and mask is None:
                    return value * rows / count, new_state  # a mean over this device's rows
                return mean(value, mask, rows, count), new_state

            (loss, new_state), grads = jax.value_and_grad(objective, has_aux=True)(params)
            if axis is not None:
                grads, loss = jax.lax.psum((grads, loss), axis)
                new_state = jax.tree.map(mean_floats, new_state)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_state, opt_state, loss

        return step

    def _jit_step(self, inputs: Any, targets: Any, mask: Any, variant: Any, key: Any) -> Any:
        rt = self.runtime
        masked, impl = variant
        batch = place(rt, self._transfer, (inputs, targets, mask) if masked else (inputs, targets))
        params, state, opt_state = self._jit_form()
        fn = self._steps.get(variant)
        if fn is None:
            step = self._build_step(impl, axis=None)
            r, b = rt.replicated, rt.batched
            fn = jax.jit(step, in_shardings=(r, r, r, b, r), out_shardings=r)
            self._steps[variant] = fn
        params, state, opt_state, loss = fn(params, state, opt_state, batch, key)
        self._plain, self._stacked, self._view = (params, state, opt_state), None, None
        return loss

    def _pmap_step(self, inputs: Any, targets: Any, mask: Any, variant: Any, key: Any) -> Any:
        rt = self.runtime
        masked, impl = variant
        batch = (inputs, targets, mask) if masked else (inputs, targets)
        local = jax.tree.map(self._pmap.rows, batch)
        if self._stacked is None:
            # One copy per device, committed where pmap puts its results: numpy inputs at
            # the first step would compile the step a second time at the next.
            self._stacked = self._pmap.stack(self._jit_form())
        fn = self._steps.get(variant)
        if fn is None:
            step = self._build_step(impl, axis=AXIS)
            devices = list(rt.mesh.devices.flat)
            fn = jax.pmap(step, axis_name=AXIS, in_axes=(0, 0, 0, 0, None), devices=devices)
            self._steps[variant] = fn
        params, state, opt_state, loss = fn(*self._stacked, local, key)
        self._stacked, self._plain, self._view = (params, state, opt_state), None, None
        if rt.processes == 1:
            return self._pmap.first(loss)  # on the devices: no wait for the step to finish
        # Several processes: pmap's results are each process's own arrays, not global ones.
        return rt.replicate(host_rows(loss)[0], broadcast=False)


def _short(treedef: Any) -> str:
    text = str(treedef)
    return text if len(text) <= 300 else text[:300] + "..."


def _key_data(rng: Any) -> tuple[str, np.ndarray]:
    """A single PRNG key (typed, any implementation, or a legacy uint32 one) as raw data."""
    if isinstance(rng, jax.Array) and jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        if rng.shape == ():
            return str(jax.random.key_impl(rng)), np.asarray(jax.random.key_data(rng))
    elif isinstance(rng, (jax.Array, np.ndarray)) and rng.shape == (2,) and rng.dtype == np.uint32:
        return "threefry2x32", np.asarray(rng)  # jax.random.PRNGKey's raw form
    raise bad_argument("rng", rng, "one PRNG key: jax.random.key(seed) (or PRNGKey(seed))")
