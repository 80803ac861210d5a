"""Model batching under JAX: N models of one architecture trained as one pytree.

`BatchModule` stacks the members' params and state into ``[batch, ...]`` arrays and runs
one member function over them (vmap, ``lax.map`` or a loop of jitted calls), chosen by
measurement (docs/batching.md). It is a pytree whose leaves are the stacked params, then
state, so ``jit``, ``grad`` and optax apply to it as they do to a `JaxModule`. It holds the
neutral skeleton (settings, member checks, decisions, explain) as a `MemberBatch` in its
static aux data and supplies its JAX hooks (`_Members`); the strategies and the probe are
in `batching.run`.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dualtrain.accelerate.decisions import code_digest
from dualtrain.batching import dispatch, isolation, members
from dualtrain.batching.skeleton import (
    ANY,
    BatchSettings,
    Framework,
    MemberBatch,
    MemberBatchModule,
)
from dualtrain.craft import Craft
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_jax.batching import probe as batching_probe, run as batching_run
from dualtrain_jax.batching.loss import batch_loss, batch_topk
from dualtrain_jax.batching.members import (
    Spec,
    craft_member,
    craft_values,
    entries_of,
    kind_of,
    pair_member,
    pair_values,
    row,
    row_shapes,
)
from dualtrain_jax.compilation.cache import use_disk_cache
from dualtrain_jax.craft import JaxModule

__all__ = ["BatchModule", "batch_loss", "batch_topk"]

FRAMEWORK = Framework("jax", "a non-empty list of modules")


@jax.tree_util.register_pytree_node_class
class BatchModule(MemberBatchModule):
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

    _framework = FRAMEWORK
    _core: MemberBatch[_Members]  # the neutral skeleton, with its JAX hooks: static aux data

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
        use_disk_cache()  # the members' compiled programs kept on disk for the next run
        settings = FRAMEWORK.settings(
            batch,
            init=init,
            seed=seed,
            shared_input=shared_input,
            strategy=strategy,
            memory_budget=memory_budget,
            check_isolation=check_isolation,
        )
        batch, init, seeds = settings.batch, settings.init, settings.seeds
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
        entries = entries_of(row_shapes(params), row_shapes(state))
        if not entries or not any(t for *_, t in entries):
            raise bad_argument("module", module, "a module that holds at least one parameter")
        self.params, self.state, self.train = params, state, train
        spec = Spec(
            one,
            kind,
            template,
            apply_fn,
            entries,
        )
        self._core = MemberBatch(FRAMEWORK, settings, _Members(settings, spec), kind)

    # -- pytree ------------------------------------------------------------------------

    def tree_flatten(self) -> tuple[tuple[Any, Any], tuple[MemberBatch[_Members], bool]]:
        return (self.params, self.state), (self._core, bool(self.train))

    @classmethod
    def tree_unflatten(
        cls, static: tuple[MemberBatch[_Members], bool], children: tuple[Any, Any]
    ) -> Any:
        out = object.__new__(cls)
        out._core, out.train = static
        out.params, out.state = children
        return out

    @property
    def _spec(self) -> Spec:
        """How one member runs (its function, Craft or apply_fn, architecture)."""
        return self._core.hooks.spec

    # -- members -----------------------------------------------------------------------

    def extract(self, index: int) -> Any:
        """Member `index`: a `JaxModule` (same mode) or a ``(params, apply_fn)`` pair."""
        i = self._core.index(index)
        params, state = row(self.params, i), row(self.state, i)
        if self._spec.template is not None:
            return JaxModule(self._spec.template.craft, params, state, train=self.train)
        return params, self._spec.apply_fn

    def insert(self, index: int, module: Any) -> None:
        """Makes member `index` a copy of `module`, rebinding `params` and `state`.

        New arrays, as `JaxModule` does. Optimizer state for the member is left as it was.
        """
        self._write(*self._core.member(index, module))

    def _write(self, i: int, values: tuple[Any, Any]) -> None:
        params, state = values
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

    def _member_keys(self, rng: Any) -> Any:
        if rng is None:
            return None
        return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(self.batch))

    def _decide(
        self, params: Any, state: Any, inputs: Sequence[Any], keys: Any, train: bool
    ) -> dispatch.Decision:
        traced = batching_run.is_traced(params, state, inputs, keys)
        return self._core.decide(_Call(params, state, inputs, keys, train, traced), train)

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
        self._core.check_inputs(inputs)
        keys = self._member_keys(rng)
        decision = self._decide(params, state, inputs, keys, bool(train))
        if decision.strategy != "loop" and _concrete((params, state, inputs, keys)):
            # Outside a trace every op would compile on its own (about 0.1 s each on a
            # CPU): one jitted program per strategy runs the call, compiled once.
            run = _eager(self._spec.one, decision.strategy, decision.chunk)
            return run(params, state, tuple(inputs), keys, self.shared_input, bool(train))
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
        self._core.check_inputs(inputs)
        keys = self._member_keys(rng)
        self._decide(self.params, self.state, inputs, keys, bool(self.train))
        return self.explain()

    def __repr__(self) -> str:
        return f"BatchModule({self._core.summary()})"


@dataclasses.dataclass
class _Call:
    """One call as the hooks see it: the stacked values, inputs, member keys and mode."""

    params: Any
    state: Any
    inputs: Sequence[Any]
    keys: Any
    train: bool
    traced: bool
    found: batching_probe.Findings | None = None  # the trace "auto" inspected, for the probe

    def run(
        self, one: Any, shared_input: bool, strategy: str = "vmap", chunk: int | None = None
    ) -> batching_run.Run:
        """This call's members run by `one` under `strategy` (in chunks of `chunk`)."""
        return batching_run.Run(
            one,
            strategy,
            chunk,
            self.params,
            self.state,
            self.inputs,
            shared_input,
            self.keys,
            self.train,
        )


class _Members:
    """The JAX hooks of a BatchModule's skeleton (`FrameworkHooks`).

    How one member runs (`Spec`); how a member is checked and a call keyed, chosen (by
    rule from its trace, or timed) and probed.
    """

    def __init__(self, settings: BatchSettings, spec: Spec) -> None:
        self.settings, self.spec = settings, spec

    # -- members -----------------------------------------------------------------------

    def values(self, module: Any, name: str) -> Any:
        spec = self.spec
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

    def modes(self, module: Any) -> Mapping[str, bool]:
        # One mode for the batch: a member in eval would run in training mode.
        return {"the module": bool(module.train)} if isinstance(module, JaxModule) else {}

    def arrays(self, value: Any) -> Iterable[tuple[str, Sequence[int]]]:
        if not batching_run.is_mapped(value, False):  # arrays, also in tuples, lists, dicts
            return ()
        return [
            (jax.tree_util.keystr(path), leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]
        ]

    # -- decisions ---------------------------------------------------------------------

    def key(self, call: Any) -> tuple[Any, ...]:
        s, spec = self.settings, self.spec
        shapes = tuple(
            (tuple(x.shape), str(x.dtype))
            if hasattr(x, "shape")
            else str(jax.tree_util.tree_map(lambda a: (tuple(a.shape), str(a.dtype)), x))
            if batching_run.is_mapped(x, False)
            else type(x).__name__
            for x in call.inputs
        )
        leaf = jax.tree_util.tree_leaves(call.params)[0]
        # Under a trace the device is unknown: any decision for these shapes fits.
        device = ANY if call.traced else str(getattr(leaf, "sharding", type(leaf).__name__))
        return (
            "jax",
            spec.arch,
            shapes,
            device,
            call.train,
            s.batch,
            s.shared_input,
            s.memory_budget,
            # what a timing depends on beyond the model: JAX's version and XLA's threads
            jax.__version__,
            os.environ.get("XLA_FLAGS", ""),
            _code_of(spec),  # the disk cache outlives an edit of the model's code
        )

    def choose(self, key: tuple[Any, ...], call: Any) -> dispatch.Decision:
        s = self.settings
        chunk = s.batch
        if s.memory_budget is not None:  # estimated from shapes: works under a trace
            need = batching_run.member_bytes(call.run(self.spec.one, s.shared_input))
            chunk = dispatch.chunk_size(s.batch, need, s.memory_budget)
        if call.traced and s.strategy == "auto":
            # Nothing can be timed under a trace: vmap (in chunks under a budget), unless
            # tune() measured these shapes before.
            return dispatch.Decision(*dispatch.plan("jax", "vmap", s.batch, chunk), "default")
        if s.strategy != "auto":
            return dispatch.Decision(*dispatch.plan("jax", s.strategy, s.batch, chunk))
        return self._auto(key, chunk, call)

    def _auto(self, key: tuple[Any, ...], chunk: int, call: _Call) -> dispatch.Decision:
        """The "auto" decision outside a trace: cached, by rule (nothing compiled), or timed."""
        s, spec = self.settings, self.spec
        cached = dispatch.CACHE.get(key)
        if cached is not None:
            return dataclasses.replace(cached, reason=f"cached, {cached.reason}")
        members_run = call.run(spec.one, s.shared_input)
        found = call.found = batching_probe.inspect(members_run)
        vmap_form = dispatch.plan("jax", "vmap", s.batch, chunk)
        if s.batch == 1 or (not found.regrouped and found.vmap_error is None):
            # vmap runs each op of one member once, batched over the members: it does the
            # members' work in the fewest calls, so timing another strategy could not pay
            # for its own compile (seconds on a cold cache).
            notes = (
                f"not timed: the members' vmapped forward and backward (traced in "
                f"{found.seconds:.2f} s, nothing compiled) run each op of one member once, "
                f"batched over the {s.batch} members; no conv becomes a grouped conv, so "
                "no other strategy is expected to be faster, and timing one would cost a "
                "compile",
            )
            decision = dispatch.Decision(*vmap_form, reason="rule", notes=notes)
            dispatch.CACHE.put(key, decision)
            return decision
        options = dispatch.candidates("jax", s.batch, chunk)
        # The loop first: each member's own program, the yardstick vmap is timed against
        # (a candidate far slower than the best is called once).
        first = vmap_form[0]
        names = ["loop", first] + [n for n in ("map",) if n in options and n != first]
        errors: dict[str, str] = {}
        if found.vmap_error is not None and first == "vmap":
            names.remove("vmap")
            errors["vmap"] = found.vmap_error
        outcome = batching_run.within_budget(
            batching_run.candidates(members_run, options),
            names,
            s.batch,
        )
        if outcome.best is None:
            raise next(iter(outcome.errors.values()))
        errors |= {
            k: f"{type(e).__name__}: {e}".splitlines()[0][:200] for k, e in outcome.errors.items()
        }
        timings = {n: t.step(s.batch) for n, t in outcome.trials.items()}
        decision = dispatch.Decision(
            outcome.best,
            options[outcome.best],
            "measured",
            dict(sorted(timings.items(), key=lambda kv: kv[1])),
            errors,
            notes=_measured_notes(outcome, found, s.batch),
        )
        dispatch.CACHE.put(key, decision)
        return decision

    def adopt(self, decision: dispatch.Decision, call: Any, probe: bool) -> str | None:
        """The isolation verdict: from the trace when it shows only JAX's own primitives."""
        if not probe or call.traced:
            return None
        s, spec = self.settings, self.spec
        found = call.found
        if found is None:
            found = batching_probe.inspect(call.run(spec.one, s.shared_input), vmapped=False)
        if not found.foreign:
            return (
                f"passed without a run ({decision.strategy}): the member's forward and "
                "backward, traced, use only JAX's own primitives, which cannot mix members "
                "(a host callback, FFI call or custom batching rule would be probed)"
            )
        culprit = (
            f"the Craft {type(spec.template.craft).__name__}'s run"
            if spec.template is not None
            else f"apply_fn {getattr(spec.apply_fn, '__qualname__', spec.apply_fn)!r}"
        )
        verdict = isolation.run_probe(
            lambda: batching_probe.probe(
                call.run(spec.one, s.shared_input, decision.strategy, decision.chunk),
                culprit=culprit,
            ),
            decision.strategy,
            ran=decision.reason == "measured",
        )
        return f"{verdict}; probed for {', '.join(found.foreign)}"


# Jitted runs of the members for calls outside a trace, by member function (weakly: a
# BatchModule's member function lives as long as it does) and (strategy, chunk).
_EAGER: weakref.WeakKeyDictionary[Any, dict[tuple[str, int | None], Any]] = (
    weakref.WeakKeyDictionary()
)


def _eager(one: Any, strategy: str, chunk: int | None) -> Any:
    runs = _EAGER.setdefault(one, {})
    run = runs.get((strategy, chunk))
    if run is None:

        def members(
            params: Any, state: Any, inputs: Any, keys: Any, shared: bool, train: bool
        ) -> tuple[Any, Any]:
            return batching_run.run_members(
                one, strategy, chunk, params, state, inputs, shared, keys, train
            )

        run = runs[strategy, chunk] = jax.jit(members, static_argnums=(4, 5))
    return run


_CODES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _code_of(spec: Spec) -> str:
    """A digest of the code the members run: every Craft class's ``run``, or ``apply_fn``."""
    found = _CODES.get(spec.one)
    if found is None:
        if spec.template is not None:
            runs: dict[Any, None] = {}
            _craft_runs(spec.template.craft, runs, set())
            found = code_digest(tuple(runs))
        else:
            found = code_digest(spec.apply_fn)
        _CODES[spec.one] = found
    return found


def _craft_runs(craft: Any, runs: dict[Any, None], seen: set[int]) -> None:
    if id(craft) in seen or len(seen) > 10_000:
        return
    seen.add(id(craft))
    runs[getattr(type(craft), "run", type(craft))] = None
    for value in vars(craft).values():
        items = value if isinstance(value, list | tuple) else (value,)
        for item in items:
            if isinstance(item, Craft):
                _craft_runs(item, runs, seen)


def _concrete(tree: Any) -> bool:
    """Every leaf an array with a value (no tracer, no Python number or object)."""
    leaves = jax.tree_util.tree_leaves(tree)
    return all(
        isinstance(x, np.ndarray)
        or (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer))
        for x in leaves
    )


def _measured_notes(
    outcome: batching_run.Outcome, found: batching_probe.Findings, batch: int
) -> tuple[str, ...]:
    """One line per candidate (timed, failed or skipped) and one for the decision's cost."""
    lines = []
    best = outcome.best
    for name, trial in sorted(outcome.trials.items(), key=lambda kv: kv[1].step(batch)):
        on = "all" if trial.members == batch else str(trial.members)
        line = (
            f"{name:<5} {trial.call * 1e3:10.3f} ms per call on {on} of {batch} members "
            f"({trial.step(batch) * 1e3:.3f} ms on all, estimated), compiled in "
            f"{trial.compile:.2f} s"
        )
        if trial.unrolled and trial.members < batch:
            line += f" (about {trial.compile_all(batch):.1f} s on all: one program per member)"
        slower = trial.step(batch) / outcome.trials[best].step(batch) if best else 1.0
        if name == best:
            line += "  <- chosen"
        elif name == "vmap" and found.regrouped and slower > 1:
            line += (
                f": {slower:.2f}x {best}'s time; vmap turns {found.regrouped} of the convs' "
                f"forward and backward into grouped convs (group count up to {found.group}), "
                f"which XLA:{jax.default_backend().upper()} runs slower than one conv per member"
            )
        elif best is not None:
            horizon = batching_run.HORIZON
            line += (
                f": {horizon} steps and the compile estimated at "
                f"{trial.job(batch, horizon):.1f} s, {best}'s at "
                f"{outcome.trials[best].job(batch, horizon):.1f} s"
            )
        lines.append(line)
    if found.vmap_error is not None:
        lines.append(f"vmap  failed: {found.vmap_error}")
    for name, error in outcome.errors.items():
        lines.append(f"{name:<5} failed: {type(error).__name__}: {error}".splitlines()[0][:240])
    for name, why in outcome.skipped.items():
        lines.append(f"{name:<5} {why}")
    if best is not None:
        why = (
            f"vmap makes {found.regrouped} convs grouped"
            if found.regrouped
            else "vmap could not be traced"
        )
        lines.append(
            f"timing cost {outcome.spent:.2f} s (compiles included) of a {outcome.budget:.2f} s "
            f"budget: {batching_run.SHARE:.0%} of {batching_run.HORIZON} steps of {best} "
            f"(about {outcome.trials[best].step(batch) * 1e3:.1f} ms a step); timed because "
            f"{why}"
        )
    return tuple(lines)
