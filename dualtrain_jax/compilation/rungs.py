"""The JAX rungs as ladder trials: EAGER (op-by-op), JIT and JIT_DONATE.

How calls are told apart and what a trial hands the ladder:
`dualtrain_jax.compilation.probe`. The trials follow the core's
`dualtrain.accelerate.ladder.Trial` protocol and leave no trace: JAX arrays are immutable,
and the only thing a trial could destroy, a donated buffer, is always a copy during trials.

* `FunctionTrial` tries a function: its outputs are compared with op-by-op JAX
  (``jax.disable_jit``). JIT_DONATE donates the positional arguments the function returns
  anew (`donation`); its timed steps feed those outputs back in, as a training loop does.
* `ModuleTrial` tries a module's ``apply`` in one mode: outputs, the new state and, in
  training mode, the parameter gradients of a fixed random projection of the outputs.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

try:  # whether no trace is being built: JAX's own test, private, so guarded
    from jax._src.core import trace_state_clean as _top_level
except ImportError:  # pragma: no cover - a JAX without it: tracer arguments still pass through

    def _top_level() -> bool:
        return True


from dualtrain.accelerate.dispatch import Decider
from dualtrain.accelerate.ladder import UnavailableError
from dualtrain_jax.compilation.cache import every_program_kept
from dualtrain_jax.compilation.keys import Layout
from dualtrain_jax.compilation.probe import copy_tree, elements, host, projection, shapes
from dualtrain_jax.craft import JaxModule

__all__ = [
    "EAGER",
    "JIT",
    "JIT_DONATE",
    "FunctionTrial",
    "ModuleTrial",
    "donation",
    "eager",
    "eager_apply",
    "jit_disabled",
    "jitted",
    "recover",
    "LAYOUTS_KEPT",
    "NewSignatureError",
    "compiled_count",
    "lane_call",
    "lane_ready",
]

EAGER, JIT, JIT_DONATE = "EAGER", "JIT", "JIT_DONATE"


class NewSignatureError(Exception):
    """A call through a fast lane (`lane_call`) met a signature its jit had not compiled.

    Raised while jit traces the function, before anything runs: nothing was donated.
    """


# .target: the function (a `_plain` wrapper) whose trace this thread's lane call forbids.
# Any other jit traced meanwhile (a host callback's, on the CPU in this thread) is not it.
_LANE = threading.local()


def lane_call(runner: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`runner` (a `jitted` jit) called with no Python check of the call's signature.

    jit's own dispatch matches the signature against what it compiled; a call it has not
    compiled would trace the function, which raises `NewSignatureError` instead (the
    caller then takes its ladder's road). Only for runners `lane_ready` accepts.
    """
    before = getattr(_LANE, "target", None)
    _LANE.target = runner.__wrapped__  # type: ignore[attr-defined]
    try:
        return runner(*args, **kwargs)
    finally:
        _LANE.target = before


def compiled_count(runner: Any) -> int | None:
    """How many programs `runner` (a jit) has compiled, where JAX says (else None).

    A lane call that made it grow ran a signature jit tells apart without a new trace
    (an array on another device, NumPy arrays): the ladder must see the next such call.
    """
    size = getattr(runner, "_cache_size", None)
    return int(size()) if callable(size) else None


def lane_ready(runner: Any) -> bool:
    """Whether `runner` is a jit of `jitted` (no fixed leaves): a lane may call it."""
    return bool(getattr(getattr(runner, "__wrapped__", None), "lane", False))


def _plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    # A plain def: jax.jit takes it whatever `fn` is (a partial, a callable object).
    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(_LANE, "target", None) is call:  # traced under its lane: not compiled
            raise NewSignatureError
        return fn(*args, **kwargs)

    call.lane = True  # type: ignore[attr-defined]
    return call


def eager(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` op by op (``jax.disable_jit``): the reference every rung is compared with."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with jax.disable_jit():
            return fn(*args, **kwargs)

    return run


def jitted(fn: Callable[..., Any], layout: Layout, donate: Sequence[int]) -> Callable[..., Any]:
    """``jax.jit(fn)`` for calls of `layout`, donating positional arguments `donate`.

    Without fixed leaves this is ``jax.jit`` itself (its C++ dispatch); with some, the
    traced leaves are picked out of each call and the fixed ones are compile-time constants.
    """
    if not layout.fixed:
        return jax.jit(_plain(fn), donate_argnums=tuple(donate))
    core = jax.jit(layout.flat(fn), donate_argnums=layout.leaf_positions(donate))

    def run(*args: Any, **kwargs: Any) -> Any:
        return core(*layout.traced_leaves(args, kwargs))

    return run


def donation(
    fn: Callable[..., Any],
    layout: Layout,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    requested: Sequence[int] | None,
) -> tuple[tuple[int, ...], dict[int, int | None]]:
    """Which positional arguments JIT_DONATE donates, and which output each one becomes.

    Args:
        fn: the function.
        layout: the call's `Layout`.
        args: the call's positional arguments.
        kwargs: the call's keyword arguments.
        requested: the user's ``donate_argnums``, or None: then every positional argument
            made of JAX arrays (at least one) whose structure, shapes and dtypes equal a
            top-level element of the output not claimed by an earlier argument.

    Returns:
        ``(argnums, feed)``: feed maps each donated argument to the output element with its
        layout (the timed steps pass it back in), or None (they donate a fresh copy).
    """
    outputs = elements(jax.eval_shape(layout.flat(fn), *layout.traced_leaves(args, kwargs)))
    wanted = [shapes(o) for o in outputs]
    claimed: set[int] = set()
    feed: dict[int, int | None] = {}
    for i, arg in enumerate(args):
        leaves = jax.tree_util.tree_leaves(arg)
        if requested is not None and i not in requested:
            continue
        if not leaves or not all(
            isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in leaves
        ):
            continue  # numbers, NumPy arrays and empty trees hold no buffer to give
        have = shapes(arg)
        match = next((j for j, w in enumerate(wanted) if j not in claimed and w == have), None)
        if match is not None:
            claimed.add(match)
            feed[i] = match
        elif requested is not None:
            feed[i] = None
    return tuple(sorted(feed)), feed


class FunctionTrial:
    """One rung of a function on the call in hand (a `RunnerTrial`).

    Args:
        name: EAGER, JIT or JIT_DONATE.
        fn: the user's function.
        layout: the call's `Layout`.
        args, kwargs: the call's arguments (never donated here: trials donate copies).
        requested: the user's ``donate_argnums`` (None: inferred, see `donation`).
    """

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        layout: Layout,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        requested: Sequence[int] | None = None,
    ) -> None:
        self.name, self.fn, self.layout = name, fn, layout
        self.args, self.kwargs, self.requested = tuple(args), dict(kwargs), requested
        self.donated: tuple[int, ...] = ()
        self._feed: dict[int, int | None] = {}
        self._run: Callable[..., Any] | None = None
        self._chain: list[Any] | None = None
        self._adopted = False

    def adopt(self, runner: Callable[..., Any]) -> None:
        """Serves `runner`, this rung's already built function (`build` then does nothing).

        Only for rungs that donate nothing (what serves while candidates wait: JIT, EAGER).
        """
        self._run, self._adopted = runner, True

    def build(self) -> None:
        if self._adopted:
            return
        if self.name == EAGER:
            self._run = eager(self.fn)
            return
        if self.name == JIT_DONATE:
            self.donated, self._feed = donation(
                self.fn, self.layout, self.args, self.kwargs, self.requested
            )
            if not self.donated:
                raise UnavailableError(
                    "nothing to donate: no positional argument of JAX arrays has the "
                    "structure, shapes and dtypes of a returned value"
                    if self.requested is None
                    else f"nothing to donate: donate_argnums={tuple(self.requested)} names "
                    "no positional argument holding JAX arrays"
                )
        self._run = jitted(self.fn, self.layout, self.donated)

    def runner(self) -> Callable[..., Any]:
        assert self._run is not None, "build() first"
        return self._run

    def _fresh(self) -> list[Any]:
        args = list(self.args)
        for i in self.donated:
            args[i] = copy_tree(args[i])
        return args

    def check(self) -> tuple[list[str], list[np.ndarray]]:
        # The reference's one-primitive programs are kept on disk (not those of op by op
        # serving a job): a check a short job could not finish goes further next run.
        kept = every_program_kept() if self.name == EAGER else contextlib.nullcontext()
        with kept:
            out = self.runner()(*self._fresh(), **self.kwargs)
            result = host(out, "out", self.layout.floor)
        if self.donated:
            # The timed steps go on from here, as a loop would: the first of them (untimed)
            # meets the outputs' placement, which may differ from the caller's (committed).
            self._chain = self._advance(list(self.args), out)
        return result

    def _advance(self, args: list[Any], out: Any) -> list[Any]:
        returned = elements(out)
        for i, j in self._feed.items():
            # what the step returned anew is its next input; an argument without a returned
            # twin is donated as a fresh copy of the caller's each step
            args[i] = copy_tree(self.args[i]) if j is None else returned[j]
        return args

    def step(self) -> None:
        run = self.runner()
        if not self.donated:
            jax.block_until_ready(run(*self.args, **self.kwargs))
            return
        args = self._chain if self._chain is not None else self._fresh()
        out = run(*args, **self.kwargs)
        jax.block_until_ready(out)
        self._chain = self._advance(args, out)

    def release(self) -> None:
        self._run, self._chain = None, None


def eager_apply(shell: JaxModule) -> Callable[..., Any]:
    """The module's plain ``apply`` op by op; one runner for both modes and any signature."""

    def run(
        params: Any, state: Any, *inputs: Any, train: bool = False, rng: Any = None, **kw: Any
    ) -> Any:
        with jax.disable_jit():
            return shell.apply(params, state, *inputs, train=train, rng=rng, **kw)

    return run


class ModuleTrial:
    """One rung of a module's ``apply`` in one mode on the batch in hand (a `RunnerTrial`).

    `check` returns the outputs, the new state and, in training mode, the gradient with
    respect to the parameters of ``sum(outputs * r)`` for a fixed random `r` (a projection
    that every output element reaches), so a rung that computes the right forward and the
    wrong backward is caught.

    Args:
        name: EAGER or JIT (JIT_DONATE is unavailable: a module's apply donates nothing,
            its params and state stay the caller's).
        shell: the module whose ``apply`` runs (arrays unused; a `TopKJaxModule` too).
        train: the mode.
        layout: the `Layout` of ``(params, state, inputs, rng)``.
        params, state, inputs, rng, kwargs: the call in hand.
    """

    def __init__(
        self,
        name: str,
        shell: JaxModule,
        train: bool,
        layout: Layout,
        params: Any,
        state: Any,
        inputs: tuple[Any, ...],
        rng: Any,
        kwargs: dict[str, Any],
    ) -> None:
        self.name, self.shell, self.train, self.layout = name, shell, train, layout
        self.batch = (params, state, inputs, rng)
        self.kwargs = kwargs
        self._run: Callable[..., Any] | None = None
        self._adopted = False

    def adopt(self, runner: Callable[..., Any]) -> None:
        """Serves `runner`, this rung's already built apply (`build` then does nothing)."""
        self._run, self._adopted = runner, True

    def _forward(self, params: Any, state: Any, inputs: tuple[Any, ...], rng: Any) -> Any:
        return self.shell.apply(params, state, *inputs, train=self.train, rng=rng, **self.kwargs)

    def build(self) -> None:
        if self._adopted:
            return
        if self.name == JIT_DONATE:
            raise UnavailableError(
                "a module's apply donates nothing (its params and state stay the caller's); "
                "TrainingLearner.step and an accelerated train step donate"
            )
        if self.name == EAGER:
            self._run = eager_apply(self.shell)
            return
        core = jitted(self._forward, self.layout, ())

        def run(
            params: Any, state: Any, *inputs: Any, train: bool = False, rng: Any = None, **kw: Any
        ) -> Any:
            # `train` and `kw` are this runner's own: it serves one (mode, signature) only.
            return core(params, state, inputs, rng)

        self._run = run

    def runner(self) -> Callable[..., Any]:
        assert self._run is not None, "build() first"
        return self._run

    def _call(self) -> Any:
        params, state, inputs, rng = self.batch
        return self.runner()(params, state, *inputs, train=self.train, rng=rng, **self.kwargs)

    def check(self) -> tuple[list[str], list[np.ndarray]]:
        kept = every_program_kept() if self.name == EAGER else contextlib.nullcontext()
        with kept:  # as FunctionTrial.check
            out, new_state = self._call()
            names, arrays = host(out, "out", self.layout.floor)
            more_names, more = host(new_state, "state", self.layout.floor)
            names, arrays = names + more_names, arrays + more
            if self.train:
                grads = self._gradients(projection(out))
                grad_names, grad_arrays = host(grads, "grad", self.layout.floor)
                names, arrays = names + grad_names, arrays + grad_arrays
        return names, arrays

    def _gradients(self, proj: list[np.ndarray | None]) -> Any:
        def total(p: Any, state: Any, inputs: tuple[Any, ...], rng: Any) -> Any:
            out, _ = self._forward(p, state, inputs, rng)
            terms = [
                jnp.sum(leaf.astype(jnp.float32) * r)
                for leaf, r in zip(jax.tree_util.tree_leaves(out), proj, strict=True)
                if r is not None
            ]
            return sum(terms, jnp.zeros((), jnp.float32))

        probe = jax.grad(total)
        run = eager(probe) if self.name == EAGER else jitted(probe, self.layout, ())
        return run(*self.batch)

    def step(self) -> None:
        jax.block_until_ready(self._call())

    def release(self) -> None:
        self._run = None


LAYOUTS_KEPT = 64  # signatures whose layout is remembered (beyond, rebuilt per call)


def jit_disabled() -> bool:
    """Whether the ladder must stand aside: JAX runs op by op, or a trace is being built.

    Op by op: the caller's `jax.disable_jit()` (or an EAGER rung's own run). Tracing: the
    call is inside the caller's ``jit``/``grad``/``vmap``/``scan`` even when every argument
    is concrete (closed-over constants), so anything the ladder computed would be a tracer
    of the caller's trace; the outer transformation compiles the plain function.
    """
    return bool(jax.config.jax_disable_jit) or not _top_level()  # type: ignore[attr-defined]


def recover(
    decider: Decider,
    mode: str,
    signature: str,
    error: Exception,
    args: Any,
    rerun: Callable[[], Any],
) -> Any:
    """The call's result after `error` from the chosen runner, rerun op by op (`rerun`).

    The fallback to eager is recorded (and cached) only when the eager rerun succeeds: when
    it raises too, the error is the function's own (a bad input, a callback that raises),
    its exception propagates and the decision stands. Re-raises `error` when eager was the
    runner, or when the failed run consumed donated inputs (nothing is left to rerun).
    """
    decision = decider.decisions.get((mode, signature))
    if decision is None or decision.chosen == decider.eager:
        raise error
    if any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree_util.tree_leaves(args)):
        raise error
    out = rerun()
    decider.fall_back(mode, signature, error)
    return out
