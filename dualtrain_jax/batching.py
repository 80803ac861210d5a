"""Model batching under JAX: N models of one architecture trained as one pytree.

`BatchModule` stacks the members' params and state into ``[batch, ...]`` arrays and runs
one member function over them (vmap, ``lax.map`` or a loop of jitted calls), chosen by
measurement (docs/batching.md). It is a pytree whose leaves are the stacked params, then
state, so ``jit``, ``grad`` and optax apply to it as they do to a `JaxModule`. The neutral
parts live in `dualtrain.batching`; the strategies and the probe in `batching_run`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dualtrain.batching import dispatch, isolation, members
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_jax import batching_probe, batching_run
from dualtrain_jax.batching_loss import batch_loss, batch_topk
from dualtrain_jax.batching_members import (
    Spec,
    craft_member,
    craft_values,
    entries_of,
    kind_of,
    pair_member,
    pair_values,
    row,
)
from dualtrain_jax.craft import JaxModule

__all__ = ["BatchModule", "batch_loss", "batch_topk"]


@jax.tree_util.register_pytree_node_class
class BatchModule:
    """`batch` models of one architecture as one pytree: stacked ``params`` and ``state``.

    Args:
        module: a realized Craft (`dualtrain_jax.realize`) or a pair ``(params, apply_fn)``
            with ``apply_fn(params, *inputs) -> outputs`` (given ``rng=`` when the call
            has one); ``(init_fn, apply_fn)`` with ``init_fn(key) -> params`` lets each
            member draw its own params in one vmapped init.
        batch: the member count, a positive int.
        init: ``"independent"`` (member i drawn from ``member_seeds(seed, batch)[i]``: for
            a Craft the weights of ``realize(craft, seed=...)`` under either framework) or
            ``"identical"`` (copies of `module`).
        seed: an int in [0, 2**64), or one seed per member.
        shared_input: every member reads the same ``[B, ...]`` inputs.
        strategy: ``"auto"`` (measure on the first call outside a trace, keep the
            fastest), ``"vmap"``, ``"map"`` (``lax.map``) or ``"loop"``.
        memory_budget: bytes one vmapped call may take; members run in chunks that fit.
        check_isolation: probe, on the first call of each strategy and mode, that no
            member moves another.

    Attributes:
        params: ``{name: [batch, ...]}`` (or the pair's params pytree, stacked).
        state: the stacked state (BatchNorm statistics); ``{}`` for a pair.
        train: the mode ``__call__`` runs in (`Rudder`, `Prober`, `Nozzle` set it).
    """

    def __init__(
        self,
        module: Any,
        batch: int,
        *,
        init: str = "independent",
        seed: int | Sequence[int] = 0,
        shared_input: bool = False,
        strategy: str = "auto",
        memory_budget: int | None = None,
        check_isolation: bool = True,
    ) -> None:
        batch = members.check_batch(batch)
        init = members.check_init(init)
        seeds = members.member_seeds(seed, batch)
        shared = members.check_flag("shared_input", shared_input)
        strategy = members.check_strategy(strategy, "jax")
        budget = members.check_memory_budget(memory_budget)
        probe = members.check_flag("check_isolation", check_isolation)
        if isinstance(module, JaxModule):
            params, state = craft_values(module, batch, init, seeds)
            one, kind, template, apply_fn = craft_member(module), kind_of(module), module, None
            train = bool(module.train)
        elif isinstance(module, (tuple, list)) and len(module) == 2 and callable(module[1]):
            first, apply_fn = module
            params = pair_values(first, batch, init, seeds)
            state, train = {}, False
            one, kind, template = pair_member(apply_fn), kind_of(module), None
        else:
            raise bad_argument(
                "module", module, "a realized Craft (dualtrain_jax.realize) or (params, apply_fn)"
            )
        entries = entries_of(row(params, 0), row(state, 0))
        if not entries or not any(t for *_, t in entries):
            raise bad_argument("module", module, "a module that holds at least one parameter")
        self.params, self.state, self.train = params, state, train
        self._spec = Spec(
            one, kind, template, apply_fn, batch, shared, strategy, budget, probe, entries
        )
        self.seeds, self.init = seeds, init

    # -- pytree ------------------------------------------------------------------------

    def tree_flatten(self) -> tuple[tuple[Any, Any], tuple[Spec, bool, Any]]:
        return (self.params, self.state), (self._spec, bool(self.train), (self.seeds, self.init))

    @classmethod
    def tree_unflatten(cls, static: tuple[Spec, bool, Any], children: tuple[Any, Any]) -> Any:
        out = object.__new__(cls)
        out._spec, out.train, (out.seeds, out.init) = static
        out.params, out.state = children
        return out

    @property
    def batch(self) -> int:
        return self._spec.batch

    @property
    def shared_input(self) -> bool:
        return self._spec.shared_input

    @property
    def strategy(self) -> str:
        return self._spec.strategy

    # -- members -----------------------------------------------------------------------

    @classmethod
    def from_modules(
        cls,
        modules: Sequence[Any],
        *,
        shared_input: bool = False,
        strategy: str = "auto",
        memory_budget: int | None = None,
        check_isolation: bool = True,
    ) -> BatchModule:
        """A BatchModule whose member i is ``modules[i]``.

        The members are JaxModules of one Craft class, or ``(params, apply_fn)`` pairs with
        the same ``apply_fn``.

        Raises:
            ArgumentError: an empty list, or members whose class, names, shapes or dtypes
                differ (the message names the first difference).
        """
        if not isinstance(modules, Sequence) or not modules:
            raise bad_argument("modules", modules, "a non-empty list of modules")
        out = cls(
            modules[0],
            len(modules),
            init="identical",
            shared_input=shared_input,
            strategy=strategy,
            memory_budget=memory_budget,
            check_isolation=check_isolation,
        )
        for i, m in enumerate(modules[1:], start=1):
            out._values_of(m, f"modules[{i}]")
            if isinstance(m, JaxModule) and bool(m.train) != out.train:
                # One mode for the batch: a member in eval would run in training mode.
                raise members.refuse_member(
                    f"modules[{i}]",
                    f"the module is in {_mode(m.train)} mode there but in "
                    f"{_mode(out.train)} mode in the first member",
                )
        for i, m in enumerate(modules[1:], start=1):
            out.insert(i, m)
        return out

    def _values_of(self, module: Any, name: str) -> tuple[Any, Any]:
        spec = self._spec
        if isinstance(module, JaxModule) and spec.template is not None:
            params, state = module.params, module.state
        elif (
            spec.apply_fn is not None
            and isinstance(module, (tuple, list))
            and len(module) == 2
            and not callable(module[0])
        ):
            if module[1] is not spec.apply_fn:
                raise ArgumentError(
                    f"{name} must have the first member's architecture; its apply_fn is "
                    f"{module[1]!r}, the first member's {spec.apply_fn!r}"
                )
            params, state = module[0], {}
        else:
            raise bad_argument(name, module, f"a member like the first: {spec.kind}")
        kind = kind_of(module)
        differs = f"it is a {kind}, the first member a {spec.kind}" if kind != spec.kind else ""
        members.compare_architectures(spec.entries, entries_of(params, state), name, differs)
        if isinstance(module, JaxModule) and spec.template is not None:
            # Every member runs through the first member's Craft and its settings.
            first = spec.template
            if type(module) is not type(first):
                raise members.refuse_member(
                    name,
                    f"it is a {type(module).__qualname__} there but a "
                    f"{type(first).__qualname__} in the first member",
                )
            found = members.config_difference(first.craft, module.craft, "craft")
            found = found or members.config_difference(
                first._statics(), module._statics(), "its settings"
            )
            if found is not None:
                raise members.refuse_member(name, found)
        return params, state

    def extract(self, index: int) -> Any:
        """Member `index`: a `JaxModule` (same mode) or a ``(params, apply_fn)`` pair."""
        i = members.check_member(index, self.batch)
        params, state = row(self.params, i), row(self.state, i)
        if self._spec.template is not None:
            return JaxModule(self._spec.template.craft, params, state, train=self.train)
        return params, self._spec.apply_fn

    def insert(self, index: int, module: Any) -> None:
        """Makes member `index` a copy of `module`, rebinding `params` and `state`.

        New arrays, as `JaxModule` does. Optimizer state for the member is left as it was.
        """
        i = members.check_member(index, self.batch)
        params, state = self._values_of(module, "module")
        put = lambda stacked, v: stacked.at[i].set(jnp.asarray(v, dtype=stacked.dtype))  # noqa: E731
        self.params = jax.tree_util.tree_map(put, self.params, params)
        self.state = jax.tree_util.tree_map(put, self.state, state)

    def replace(self, **changes: Any) -> BatchModule:
        """A copy with `params` and/or `state` replaced (same members' spec and mode)."""
        out = jax.tree_util.tree_unflatten(
            jax.tree_util.tree_structure(self), jax.tree_util.tree_leaves(self)
        )
        out.params = changes.get("params", self.params)
        out.state = changes.get("state", self.state)
        return out

    # -- running -----------------------------------------------------------------------

    def _check_inputs(self, inputs: Sequence[Any]) -> None:
        if not inputs:
            raise ArgumentError("BatchModule needs at least one input; got none")
        if self.shared_input:
            return
        for i, x in enumerate(inputs):
            if batching_run.is_mapped(x, False):  # arrays, also inside tuples, lists, dicts
                for path, leaf in jax.tree_util.tree_flatten_with_path(x)[0]:
                    name = f"inputs[{i}]{jax.tree_util.keystr(path)}"
                    members.check_leading(name, leaf.shape, self.batch, "[batch, B, ...]")

    def _member_keys(self, rng: Any) -> Any:
        if rng is None:
            return None
        return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(self.batch))

    def _decide(
        self, params: Any, state: Any, inputs: Sequence[Any], keys: Any, train: bool
    ) -> dispatch.Decision:
        spec = self._spec
        shapes = tuple(
            (tuple(x.shape), str(x.dtype))
            if hasattr(x, "shape")
            else str(jax.tree_util.tree_map(lambda a: (tuple(a.shape), str(a.dtype)), x))
            if batching_run.is_mapped(x, False)
            else type(x).__name__
            for x in inputs
        )
        traced = batching_run.is_traced(params, state, inputs, keys)
        leaf = jax.tree_util.tree_leaves(params)[0]
        # Under a trace the device is unknown: any decision for these shapes fits.
        device = "" if traced else str(getattr(leaf, "sharding", type(leaf).__name__))
        key = (
            "jax",
            spec.arch,
            shapes,
            device,
            train,
            spec.batch,
            spec.shared_input,
            spec.memory_budget,
        )
        for known_key, known in spec.decisions.items():
            if known_key == key or (traced and known_key[:3] + known_key[4:] == key[:3] + key[4:]):
                spec.decision = known
                spec.isolation = spec.probed.get((known.strategy, train), spec.isolation)
                return known
        chunk = spec.batch
        if spec.memory_budget is not None:  # estimated from shapes: works under a trace
            need = batching_run.member_bytes(
                spec.one, params, state, inputs, spec.shared_input, keys, train
            )
            chunk = dispatch.chunk_size(spec.batch, need, spec.memory_budget)
        if traced and spec.strategy == "auto":
            # Nothing can be timed under a trace: vmap (in chunks under a budget), unless
            # tune() measured these shapes before.
            return dispatch.Decision(*dispatch.plan("jax", "vmap", spec.batch, chunk), "default")
        decision = dispatch.decide(
            "jax",
            spec.strategy,
            spec.batch,
            chunk,
            key,
            lambda options, members: batching_run.timed_runs(
                spec.one, options, params, state, inputs, spec.shared_input, keys, train, members
            ),
        )
        probe_key = (decision.strategy, train)
        # Once per strategy and mode: a module may mix members only in training (a batch
        # statistic), or only under one strategy.
        if spec.check_isolation and probe_key not in spec.probed and not traced:
            culprit = (
                f"the Craft {type(spec.template.craft).__name__}'s run"
                if spec.template is not None
                else f"apply_fn {getattr(spec.apply_fn, '__qualname__', spec.apply_fn)!r}"
            )
            spec.probed[probe_key] = isolation.run_probe(
                lambda: batching_probe.probe(
                    spec.one,
                    decision.strategy,
                    decision.chunk,
                    params,
                    state,
                    inputs,
                    spec.shared_input,
                    keys,
                    train,
                    culprit,
                ),
                decision.strategy,
                ran=decision.reason == "measured",
            )
        spec.isolation = spec.probed.get(probe_key)
        spec.decisions[key] = decision
        spec.decision = decision
        return decision

    def apply(
        self,
        params: Any,
        state: Any,
        *inputs: Any,
        train: bool = False,
        rng: jax.Array | None = None,
    ) -> tuple[Any, Any]:
        """Runs every member: ``(outputs [batch, B, ...], new_state)``.

        Pure, so jit and grad apply. `rng` is split per member (``fold_in(rng, i)``), so
        dropout draws differ between members.
        """
        self._check_inputs(inputs)
        keys = self._member_keys(rng)
        decision = self._decide(params, state, inputs, keys, bool(train))
        return batching_run.run_members(
            self._spec.one,
            decision.strategy,
            decision.chunk,
            params,
            state,
            inputs,
            self.shared_input,
            keys,
            bool(train),
        )

    def __call__(self, *inputs: Any, rng: jax.Array | None = None) -> Any:
        out, new_state = self.apply(self.params, self.state, *inputs, train=self.train, rng=rng)
        if self.train:
            self.state = new_state
        return out

    def tune(self, *inputs: Any, rng: jax.Array | None = None) -> str:
        """Chooses the strategy (and probes isolation) now; returns `explain`.

        Call it outside any trace, so a later ``jax.jit`` uses the measured choice.
        """
        self._check_inputs(inputs)
        keys = self._member_keys(rng)
        self._decide(self.params, self.state, inputs, keys, bool(self.train))
        return self.explain()

    def explain(self) -> str:
        """The strategy in use, why, the measured timings, and the isolation probe's result."""
        spec = self._spec
        return dispatch.explain_text(spec.decision, "jax", spec.batch, spec.isolation)

    def __repr__(self) -> str:
        return (
            f"BatchModule(batch={self.batch}, module={self._spec.kind}, strategy={self.strategy!r})"
        )


def _mode(train: object) -> str:
    return "training" if train else "eval"
