"""A realized JAX module whose ``apply`` runs under the rung its ladder chose per mode.

`AcceleratedModule` is a `JaxModule` (same pytree leaves, params and state keys, picklable,
``replace``) whose ``apply`` is decided per mode (``train``) and input signature and
verified on outputs, the new state and, in training mode, parameter gradients; every copy
the pytree makes shares one `ModuleAccelerator` (its decisions). `accelerate` makes one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from dualtrain.accelerate.dispatch import Decider
from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import Explanation
from dualtrain.accelerate.rungs import DEFAULTS
from dualtrain.craft import Craft
from dualtrain_jax.compilation.cache import use_disk_cache
from dualtrain_jax.compilation.keys import Layout, call_key, module_parts
from dualtrain_jax.compilation.rungs import (
    LAYOUTS_KEPT,
    ModuleTrial,
    eager_apply,
    jit_disabled,
    recover,
)
from dualtrain_jax.craft import JaxModule

__all__ = ["AcceleratedModule"]


class ModuleAccelerator:
    """The decisions of one accelerated module, shared by every copy the pytree makes."""

    def __init__(
        self,
        shell: JaxModule,
        backends: Any,
        options: LadderOptions,
        approximations: Sequence[str] = (),
    ) -> None:
        use_disk_cache()  # before the first compile: the ladder's and the rung chosen
        self.shell = shell  # the plain (or top-k patched) module, holding no arrays
        self.options = options
        self.decider = Decider("jax", backends, options, approximations)
        self._layouts: dict[Any, Layout] = {}
        self._names: dict[str, int] = {}  # signature text -> hash of its key (`Layout.of`)
        self._key_parts = module_parts(shell)

    def recipe(self) -> tuple[Any, ...]:
        """What pickling keeps: the decisions are remade (or read from the cache)."""
        return (self.shell, self.decider.backends, self.options, tuple(self.decider.approximations))

    def apply(
        self,
        params: Any,
        state: Any,
        *inputs: Any,
        train: bool = False,
        rng: Any = None,
        **kwargs: Any,
    ) -> Any:
        train = bool(train)
        plain = self.shell.apply
        if jit_disabled():
            return plain(params, state, *inputs, train=train, rng=rng, **kwargs)
        found = call_key(((params, state, inputs, rng), {}))
        try:
            fixed = tuple(sorted(kwargs.items()))
            hash(fixed)
        except TypeError:
            found = None
        if found is None:
            return plain(params, state, *inputs, train=train, rng=rng, **kwargs)
        key, leaves, treedef = found
        key = (key, fixed)
        layout = self._layouts.get(key)
        if layout is None:
            shown = [*inputs, *([rng] if rng is not None else []), *kwargs.values()]
            layout = Layout.of(key, leaves, treedef, shown, self._names)
            if len(self._layouts) < LAYOUTS_KEPT:
                self._layouts[key] = layout
        mode, signature = ("train" if train else "eval"), layout.signature
        runner = self.decider.known(mode, signature)
        if runner is None:

            def trials(names: Sequence[str]) -> list[Any]:
                return [
                    ModuleTrial(n, self.shell, train, layout, params, state, inputs, rng, kwargs)
                    for n in names
                ]

            runner = self.decider.decide(mode, signature, self._key_parts, trials)
        try:
            return runner(params, state, *inputs, train=train, rng=rng, **kwargs)
        except Exception as error:
            return recover(
                self.decider,
                mode,
                signature,
                error,
                (),
                lambda: eager_apply(self.shell)(
                    params, state, *inputs, train=train, rng=rng, **kwargs
                ),
            )


@jax.tree_util.register_pytree_node_class
class AcceleratedModule(JaxModule):
    """A `JaxModule` whose ``apply`` (and so ``__call__``) runs the rung its ladder chose.

    Decided per mode ("train"/"eval", from ``apply``'s `train`) and input signature; verified
    on the outputs, the new state and, in training mode, the gradients with respect to the
    parameters. It is a JaxModule in every other way: the same pytree leaves (params, then
    state), keys, modes (`Rudder`/`Nozzle`), ``replace``, pickling and checkpoints. Copies
    made by JAX transformations share the decisions. Its JIT_DONATE rung is unavailable: an
    ``apply`` never donates the caller's params or state (a train step does, see
    `TrainingLearner`).
    """

    def __init__(
        self,
        craft: Craft,
        params: dict[str, Any],
        state: dict[str, Any],
        train: bool = False,
        accelerator: ModuleAccelerator | None = None,
    ) -> None:
        super().__init__(craft, params, state, train=train)
        if accelerator is None:  # built bare (e.g. by a JaxModule helper): the defaults
            accelerator = ModuleAccelerator(
                JaxModule(craft, {}, {}), DEFAULTS["jax"], LadderOptions()
            )
        self.accelerator = accelerator

    def _statics(self) -> dict[str, Any]:  # copies made by the pytree share the decisions
        return {"accelerator": self.accelerator}

    def apply(
        self,
        params: dict[str, Any],
        state: dict[str, Any],
        *inputs: Any,
        train: bool = False,
        rng: jax.Array | None = None,
        **kwargs: Any,
    ) -> tuple[Any, dict[str, Any]]:
        """`JaxModule.apply`, run by the rung chosen for (mode, signature); pure."""
        out: tuple[Any, dict[str, Any]] = self.accelerator.apply(
            params, state, *inputs, train=train, rng=rng, **kwargs
        )
        return out

    def _layer_table(self) -> dict[type, Any]:
        return self.accelerator.shell._layer_table()

    def explain(self) -> Explanation:
        """What was tried, chosen and rejected per mode and signature, and why."""
        return self.accelerator.decider.explain()

    def unwrap(self) -> JaxModule:
        """The plain (or top-k patched) module holding this one's arrays and mode."""
        plain = self.accelerator.shell.replace(params=self.params, state=self.state)
        plain.train = self.train
        return plain

    def __reduce__(self) -> tuple[Any, ...]:
        # The compiled runners do not pickle; the recipe does, and the decision cache makes
        # the copy's first calls cheap.
        return (
            _rebuild,
            (self.craft, self.params, self.state, self.train, self.accelerator.recipe()),
        )

    def __repr__(self) -> str:
        ladder = " -> ".join(self.accelerator.decider.backends)
        return f"Accelerated{super().__repr__()[:-1]}, {ladder})"


def _rebuild(
    craft: Craft, params: Any, state: Any, train: bool, recipe: tuple[Any, ...]
) -> AcceleratedModule:
    shell, backends, options, approximations = recipe
    accelerator = ModuleAccelerator(shell, backends, options, approximations)
    return AcceleratedModule(craft, params, state, train=train, accelerator=accelerator)
