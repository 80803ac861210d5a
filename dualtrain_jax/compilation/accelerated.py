"""`accelerate`: nebulgym's ``accelerate_model`` for JAX, a verified ladder of ``jax.jit`` forms.

The ladder is ``JIT_DONATE -> JIT -> EAGER`` (`dualtrain.accelerate.rungs`). On the first
call per input signature each rung runs the call side-effect free, its results are compared
with op-by-op JAX (``jax.disable_jit``, the reference) and the verified rungs are timed over
a few warm steps; the fastest that beats eager by ``min_speedup`` serves that signature from
then on, else eager does (`dualtrain.accelerate.dispatch.Decider`). Verdicts are kept on disk
(`dualtrain.accelerate.decisions`), so a second run skips the trials.

* A function (a train step ``step(params, opt_state, batch) -> (params, opt_state, loss)``,
  an eval function) becomes an `AcceleratedFunction`.
* A realized module (`dualtrain_jax.craft.JaxModule`) becomes an `AcceleratedModule`: a
  JaxModule (same pytree leaves, params and state keys, picklable) whose ``apply`` is
  decided per mode (``train``) and signature, and verified on outputs, new state and, in
  training mode, parameter gradients.

Calls made while tracing (inside the caller's own ``jit``, ``grad`` or ``vmap``) and under
``jax.disable_jit`` run the plain function: the outer transformation compiles it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from dualtrain.accelerate.decisions import function_digest
from dualtrain.accelerate.dispatch import Decider, Probation
from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import CHOSEN, Explanation
from dualtrain.accelerate.rungs import DEFAULTS, parse_backends
from dualtrain.craft import Craft
from dualtrain.errors import bad_argument
from dualtrain_jax.compilation.cache import use_disk_cache
from dualtrain_jax.compilation.keys import Layout, call_key, platform_parts
from dualtrain_jax.compilation.module import AcceleratedModule, ModuleAccelerator
from dualtrain_jax.compilation.rungs import (
    JIT_DONATE,
    LAYOUTS_KEPT,
    FunctionTrial,
    NewSignatureError,
    compiled_count,
    eager,
    jit_disabled,
    jitted,
    lane_call,
    lane_ready,
    recover,
)
from dualtrain_jax.craft import JaxModule
from dualtrain_jax.sparse_backprop import approximations, patch_dense

__all__ = [
    "AcceleratedFunction",
    "AcceleratedModule",
    "accelerate",
    "accelerate_model",
]


# -- functions ----------------------------------------------------------------------------


class AcceleratedFunction:
    """A function run by the rung its ladder chose per input signature (`accelerate`).

    Calling it is calling the function. The first call with a new signature (the pytree
    structure, each array's shape, dtype, weak type and sharding, each number's type and
    any other leaf's value) decides; later calls with that signature cost a flatten and a
    dict look-up on top of the chosen runner.

    Donation: when JIT_DONATE serves a signature, the positional arguments it donates
    (`explain` names them) are deleted by each call, as with ``jax.jit(donate_argnums=)``:
    use what the function returns. Trials never donate the caller's arrays (they donate
    copies), so the deciding call consumes its inputs only if JIT_DONATE is chosen.

    Attributes:
        __wrapped__: the function.
    """

    __wrapped__: Callable[..., Any]

    def __init__(
        self,
        fn: Callable[..., Any],
        backends: Any,
        options: LadderOptions,
        *,
        donate_argnums: Sequence[int] | None = None,
        mode: str = "call",
        key_parts: dict[str, Any] | None = None,
    ) -> None:
        use_disk_cache()  # before the first compile: the ladder's and the rung chosen
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._mode = mode
        self._donate = donate_argnums
        self._decider = Decider("jax", backends, options)
        self._layouts: dict[Any, Layout] = {}
        self._names: dict[str, int] = {}  # signature text -> hash of its key (`Layout.of`)
        # signature -> (its JIT_DONATE runner, the donated leaves' indices, an undonating jit)
        self._donating: dict[str, tuple[Any, frozenset[int], list[Any]]] = {}
        # The fast lane: (runner, signature, its donated leaves or None) while one signature
        # was ever seen and its decision is final; calls then go to jit's own dispatch.
        # (runner, signature, donated leaves or None, leaf count, programs compiled then)
        self._lane: tuple[Any, str, frozenset[int] | None, int, int | None] | None = None
        self._lane_closed = False  # a second signature was met: the ladder's road for good
        self._key_parts = {
            "kind": "function",
            "function": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}",
            "code": function_digest(fn),
            "donate_argnums": None if donate_argnums is None else list(donate_argnums),
            **platform_parts(),
            **(key_parts or {}),
        }

    @property
    def backends(self) -> tuple[str, ...]:
        """The rungs tried, in order (eager last)."""
        return self._decider.backends

    def explain(self) -> Explanation:
        """What was tried, chosen and rejected per signature, and why (``print`` it)."""
        return self._decider.explain()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if jit_disabled():
            return self._fn(*args, **kwargs)
        lane = self._lane
        if lane is not None:
            fast, signature, donated, count, compiled = lane
            if self._decider.known(self._mode, signature) is not fast:
                self._lane = None  # the decision changed (a fall-back): the road below
            elif donated is not None and _lane_aliased((args, kwargs), donated, count):
                pass  # this call alone takes the road below (undonated), or a new structure
            else:
                try:
                    out = lane_call(lane[0], *args, **kwargs)
                except NewSignatureError:  # traced, nothing ran: the ladder decides below
                    self._lane, self._lane_closed = None, True
                except Exception as error:  # as the road below handles a runtime failure
                    self._lane = None
                    return self._recover(signature, error, args, kwargs)
                else:
                    if compiled is not None and compiled_count(lane[0]) != compiled:
                        # jit compiled anew without a trace (another device, NumPy
                        # arrays): later calls take the road below, where it is decided.
                        self._lane, self._lane_closed = None, True
                    return out
        found = call_key((args, kwargs))
        if found is None:  # traced by the caller's transformation, or unhashable fixed leaves
            return self._fn(*args, **kwargs)
        key, leaves, treedef = found
        layout = self._layouts.get(key)
        if layout is None:
            layout = Layout.of(key, leaves, treedef, [*args, *kwargs.values()], self._names)
            if len(self._layouts) < LAYOUTS_KEPT:
                self._layouts[key] = layout
        signature = layout.signature
        runner = self._decider.known(self._mode, signature)
        if runner is None:
            runner = self._decide(layout, args, kwargs)
        if type(runner) is Probation:  # what this call runs, after any climb that is due
            runner = runner.serving()
        else:
            self._open_lane(runner, layout)
        donating = self._donating.get(signature)
        if donating is not None and donating[0] is runner and _aliased(leaves, donating[1]):
            runner = self._undonated(layout, donating[2])
        try:
            return runner(*args, **kwargs)
        except Exception as error:
            return self._recover(signature, error, args, kwargs)

    def _recover(
        self, signature: str, error: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return recover(
            self._decider,
            self._mode,
            signature,
            error,
            (args, kwargs),
            lambda: eager(self._fn)(*args, **kwargs),
        )

    def _open_lane(self, runner: Any, layout: Layout) -> None:
        """Calls go straight to `runner` from now on, while nothing else is seen.

        Only while one signature was ever seen (jit's dispatch then tells a new one by a
        trace, `NewSignatureError`), its decision final (`runner` is no `Probation`) and
        `runner` a plain jit (no fixed leaves to pick out of each call).
        """
        if self._lane_closed or self._lane is not None or len(self._layouts) != 1:
            return
        if layout.fixed or not lane_ready(runner):
            return
        donating = self._donating.get(layout.signature)
        donated = donating[1] if donating is not None and donating[0] is runner else None
        count = len(layout.fixed) + len(layout.traced)
        self._lane = (runner, layout.signature, donated, count, compiled_count(runner))

    def _undonated(self, layout: Layout, made: list[Any]) -> Callable[..., Any]:
        # A buffer donated and passed again in the same call is refused by XLA; this call
        # alone runs the same jit without donation (built once per signature).
        if not made:
            made.append(jitted(self._fn, layout, ()))
        runner: Callable[..., Any] = made[0]
        return runner

    def _decide(
        self, layout: Layout, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[..., Any]:
        made: list[FunctionTrial] = []

        def trials(names: Sequence[str]) -> list[Any]:
            new = [FunctionTrial(n, self._fn, layout, args, kwargs, self._donate) for n in names]
            made.extend(new)
            return new

        def settled() -> None:
            self._note_donation(layout, made)

        runner = self._decider.decide(
            self._mode, layout.signature, self._key_parts, trials, settled
        )
        self._note_donation(layout, made)
        return runner

    def _note_donation(self, layout: Layout, made: list[FunctionTrial]) -> None:
        """Remembers what the signature's JIT_DONATE runner donates, once it is the choice."""
        decision = self._decider.decisions[(self._mode, layout.signature)]
        runner = self._decider.known(self._mode, layout.signature)
        if type(runner) is Probation:  # a final decision whose steady time is watched
            runner = runner.current
        donated = next((t.donated for t in made if t.name == JIT_DONATE and t.donated), ())
        if decision.chosen == JIT_DONATE and donated:
            starts = layout.starts
            leaves = frozenset(i for n in donated for i in range(starts[n], starts[n + 1]))
            self._donating[layout.signature] = (runner, leaves, [])
            note = f"donates positional arguments {list(donated)}"
            for attempt in decision.attempts:
                if (
                    attempt.rung == JIT_DONATE
                    and attempt.status == CHOSEN
                    and note not in attempt.reason
                ):
                    attempt.reason = f"{attempt.reason}; {note}".lstrip("; ")

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        # As a method: the instance is the first positional argument (a fixed leaf).
        if instance is None:
            return self
        return functools.partial(self, instance)

    def __repr__(self) -> str:
        name = getattr(self._fn, "__qualname__", repr(self._fn))
        return f"AcceleratedFunction({name}, {' -> '.join(self.backends)})"


def _lane_aliased(call: Any, donated: frozenset[int], count: int) -> bool:
    """Whether a lane call must leave the lane for the road below.

    A donated array passed twice, or a call of another structure (its leaves are not the
    lane's, so the donated places say nothing).
    """
    leaves = jax.tree_util.tree_leaves(call)
    return len(leaves) != count or _aliased(leaves, donated)


def _aliased(leaves: Sequence[Any], donated: frozenset[int]) -> bool:
    """Whether a donated leaf's array is also another leaf of the call (or donated twice)."""
    ids = {id(leaves[i]) for i in donated}
    if len(ids) < len(donated):
        return True
    return any(id(x) in ids for i, x in enumerate(leaves) if i not in donated)


# -- the entry points ---------------------------------------------------------------------


def _check_donate(donate_argnums: Any) -> tuple[int, ...] | None:
    if donate_argnums is None:
        return None
    items = (donate_argnums,) if isinstance(donate_argnums, int) else donate_argnums
    try:
        items = tuple(items)
    except TypeError:
        items = (donate_argnums,)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise bad_argument(
            "donate_argnums", donate_argnums, "None, an int >= 0 or a sequence of them"
        )
    return tuple(sorted(set(items)))


def accelerate(
    fn_or_module: Any,
    backends: Any = DEFAULTS["jax"],
    patch_backprop: bool = False,
    *,
    donate_argnums: int | Sequence[int] | None = None,
    **options: Any,
) -> Any:
    """`fn_or_module` run by the fastest rung verified equal to op-by-op JAX.

    Args:
        fn_or_module: a function (a train step, an eval function) or a realized
            `JaxModule` (``dualtrain_jax.realize(craft, seed=...)``). A bare Craft is refused:
            realize it first, so the seed is yours.
        backends: rung names in order among "JIT_DONATE", "JIT", "EAGER" (case-insensitive;
            None: all three); "EAGER" closes the ladder whether named or not.
        patch_backprop: modules only: meProp top-k backprop through every ``dock.Dense``
            (`dualtrain_jax.sparse_backprop.patch_dense`, default ratio 0.04), approximate
            and listed by ``explain()``. In a function, call
            ``dualtrain_jax.sparse_backprop.topk_dense`` yourself.
        donate_argnums: functions only: the positional arguments JIT_DONATE donates; None
            donates those whose structure, shapes and dtypes equal a returned value.
        **options: `LadderOptions` fields: rtol, atol, compile_budget, warm_steps,
            min_speedup, max_signatures, cache, clock.

    Returns:
        An `AcceleratedFunction` for a function, an `AcceleratedModule` for a module.

    Raises:
        ArgumentError: not a function or realized module, an unknown rung or option, a bad
            `donate_argnums`, or `patch_backprop` on a function.
    """
    ladder = LadderOptions.from_keywords(options)
    donate = _check_donate(donate_argnums)
    if not isinstance(patch_backprop, bool):
        raise bad_argument("patch_backprop", patch_backprop, "True or False")
    if isinstance(fn_or_module, Craft):
        raise bad_argument(
            "fn_or_module",
            fn_or_module,
            "a function or a realized module: realize the Craft first "
            "(dualtrain_jax.realize(craft, seed=...)) and accelerate the module",
        )
    if isinstance(fn_or_module, JaxModule):
        if donate is not None:
            raise bad_argument(
                "donate_argnums", donate_argnums, "None for a module (its apply donates nothing)"
            )
        return _accelerate_module(fn_or_module, backends, patch_backprop, ladder)
    if isinstance(fn_or_module, type) or not callable(fn_or_module):
        raise bad_argument(
            "fn_or_module", fn_or_module, "a function or a realized dualtrain_jax module"
        )
    if patch_backprop:
        raise bad_argument(
            "patch_backprop",
            patch_backprop,
            "False for a function: call dualtrain_jax.sparse_backprop.topk_dense inside it",
        )
    fn = fn_or_module.__wrapped__ if isinstance(fn_or_module, AcceleratedFunction) else fn_or_module
    return AcceleratedFunction(fn, backends, ladder, donate_argnums=donate)


def _accelerate_module(
    module: JaxModule, backends: Any, patch_backprop: bool, options: LadderOptions
) -> AcceleratedModule:
    if isinstance(module, AcceleratedModule):
        module = module.unwrap()
    if patch_backprop:
        module, _ = patch_dense(module)
    lines = [a.describe() for a in approximations(module)]  # patched here or before
    shell = module.replace(params={}, state={})
    accelerator = ModuleAccelerator(shell, backends, options, lines)
    return AcceleratedModule(
        module.craft, module.params, module.state, train=module.train, accelerator=accelerator
    )


def accelerate_model(
    backends: Any = DEFAULTS["jax"], patch_backprop: bool = False, **options: Any
) -> Any:
    """Nebulgym's decorator: ``@accelerate_model(...)`` (or bare ``@accelerate_model``).

    Decorates a function (or wraps a realized module) with `accelerate` and the same
    arguments; everything is validated when the decorator is made.

    Args:
        backends: as in `accelerate`; or, used bare, the decorated function.
        patch_backprop: as in `accelerate` (modules only).
        **options: `LadderOptions` fields (``donate_argnums``: use `accelerate`).
    """
    if callable(backends) and not isinstance(backends, str):
        return accelerate(backends)  # used bare: `backends` is the decorated function
    LadderOptions.from_keywords(options)
    parse_backends(backends, "jax")  # a misspelt rung fails where the decorator is written

    def decorate(fn_or_module: Any) -> Any:
        return accelerate(fn_or_module, backends, patch_backprop, **options)

    return decorate
