"""How a JAX BatchModule runs its members: the strategies, and their timing within a budget.

Every strategy calls one member function ``one(params, state, key, train, *inputs) ->
(outputs, new_state)`` on member i's slice of the stacked arrays: "vmap" maps it over all
members, "map" runs it member by member (or chunk by chunk under a memory budget) inside
one ``lax.map``, "loop" calls a jitted member function once per member.

Timing a candidate means compiling it, which on a cold cache costs far more than a call
(seconds for a small CNN on XLA:CPU), so `within_budget` times candidates on `SMALL`
members and only while the time spent stays within `SHARE` of `HORIZON` steps of the best
strategy found so far.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "HORIZON",
    "SHARE",
    "SMALL",
    "Candidate",
    "Outcome",
    "Run",
    "Trial",
    "abstract_members",
    "candidates",
    "is_array",
    "is_mapped",
    "is_traced",
    "member_bytes",
    "member_row",
    "run_members",
    "within_budget",
]

# The training steps a decision is planned for, and the share of their estimated time the
# decision may spend compiling and timing candidates (a cold cache pays every compile).
HORIZON = 150
SHARE = 0.10
# Members the candidates are timed on: compile time hardly depends on the member count
# (except the loop's, which unrolls the members), call time does, and XLA:CPU's grouped
# convs grow faster than linearly in it, so a small round is both cheap and telling.
SMALL = 2
# Calls timed per candidate at most; its time is the fastest.
REPEATS = 3
# Candidates within this factor of the best on SMALL members are timed again on all of
# them, when the budget allows.
CLOSE = 1.5
# A call at most this share of its compile is repeated once whatever the budget.
CHEAP = 0.1

Member = Callable[..., tuple[Any, Any]]


def is_traced(*trees: Any) -> bool:
    """Whether any leaf is a tracer (inside jit, grad or vmap): then nothing can be timed."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(trees))


def member_row(tree: Any, index: Any) -> Any:
    """Row(s) `index` of every leaf of a stacked pytree."""
    return jax.tree_util.tree_map(lambda a: a[index], tree)


def _rows(tree: Any, batch: int) -> list[Any]:
    """The `batch` members of a stacked pytree, split by one ``unstack`` per leaf.

    Its gradient is one ``stack``; indexing member by member made each member's gradient a
    padded full-size array, summed N times (for 16 MLPs 3072-64-4 the loop took twice
    vmap's time, most of it in those sums).
    """
    leaves, tree_def = jax.tree_util.tree_flatten(tree)
    split = [
        list(jnp.unstack(a))
        if jnp.issubdtype(a.dtype, jnp.number)
        else [a[i] for i in range(batch)]
        for a in leaves
    ]
    return [jax.tree_util.tree_unflatten(tree_def, [s[i] for s in split]) for i in range(batch)]


def is_array(x: Any) -> bool:
    """A JAX or NumPy array (not a Python number, nor a container)."""
    return isinstance(x, (jax.Array, np.ndarray))


def is_mapped(x: Any, shared: bool) -> bool:
    """Whether input `x` is split per member: an array, or a tuple, list or dict of arrays.

    Anything else (a Python number, a flag, a container holding one) reaches every member
    whole, as do all inputs with `shared`.
    """
    leaves = jax.tree_util.tree_leaves(x)
    return not shared and bool(leaves) and all(is_array(leaf) for leaf in leaves)


@functools.lru_cache(maxsize=256)
def _jitted(one: Member, train: bool) -> Callable[..., tuple[Any, Any]]:
    return jax.jit(lambda p, s, k, *x: one(p, s, k, train, *x))


def run_members(
    one: Member,
    strategy: str,
    chunk: int | None,
    params: Any,
    state: Any,
    inputs: Sequence[Any],
    shared: bool,
    keys: Any,
    train: bool,
) -> tuple[Any, Any]:
    """``(outputs, new_state)``, each leaf ``[batch, ...]``, under `strategy`."""
    batch = jax.tree_util.tree_leaves(params)[0].shape[0]
    mapped = [is_mapped(x, shared) for x in inputs]
    if strategy == "loop":
        f = _jitted(one, train)
        rows = zip(
            _rows(params, batch),
            _rows(state, batch),
            [None] * batch if keys is None else _rows(keys, batch),
            *(_rows(x, batch) if m else [x] * batch for x, m in zip(inputs, mapped, strict=True)),
            strict=True,
        )
        results = [f(p, s, k, *x) for p, s, k, *x in rows]
        return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *results)

    def call(p: Any, s: Any, k: Any, xs: Sequence[Any]) -> tuple[Any, Any]:
        it = iter(xs)
        full = [next(it) if m else x for x, m in zip(inputs, mapped, strict=True)]
        return one(p, s, k, train, *full)

    batched = [x for x, m in zip(inputs, mapped, strict=True) if m]
    if strategy == "vmap":
        kdim = None if keys is None else 0
        return jax.vmap(call, in_axes=(0, 0, kdim, 0))(params, state, keys, batched)
    return jax.lax.map(lambda a: call(*a), (params, state, keys, batched), batch_size=chunk)


@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compared by identity
class Run:
    """One call of the members under one strategy: `run_members`'s arguments as one value.

    What the work around a call takes (the probe, a timed candidate, a trace); the
    forward itself calls `run_members` with them unwrapped.
    """

    one: Member
    strategy: str
    chunk: int | None
    params: Any
    state: Any
    inputs: Sequence[Any]
    shared: bool
    keys: Any
    train: bool

    def on(self, params: Any, state: Any, xs: Sequence[Any], keys: Any) -> tuple[Any, Any]:
        """``(outputs, new_state)`` under this run's strategy for other values of its kind."""
        return run_members(
            self.one, self.strategy, self.chunk, params, state, xs, self.shared, keys, self.train
        )


def _total(out: Any) -> Any:
    leaves = [
        jnp.sum(leaf)
        for leaf in jax.tree_util.tree_leaves(out)
        if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating)
    ]
    return sum(leaves) if leaves else jnp.zeros(())


def abstract_members(run: Run, members: int) -> tuple[Any, Any, Any, list[Any]]:
    """Shapes and dtypes of the first `members` members: ``(params, state, keys, batched)``.

    `batched` holds the inputs split per member (`is_mapped`), in order. Abstract
    (``jax.ShapeDtypeStruct``), so tracing or lowering with them computes nothing, on
    concrete arrays and under a trace alike.
    """
    rows = lambda a: jax.ShapeDtypeStruct((members, *a.shape[1:]), a.dtype)  # noqa: E731
    batched = [jax.tree_util.tree_map(rows, x) for x in run.inputs if is_mapped(x, run.shared)]
    return (
        jax.tree_util.tree_map(rows, run.params),
        jax.tree_util.tree_map(rows, run.state),
        None if run.keys is None else rows(run.keys),
        batched,
    )


def members_loss(run: Run) -> Callable[[Any, Any, Any, list[Any]], Any]:
    """``loss(params, state, keys, batched)``: the sum of every member's float outputs.

    `batched` replaces the inputs split per member, in order; the others are used as
    given. Its gradient in `params` is what a training step computes.
    """
    mapped = [is_mapped(x, run.shared) for x in run.inputs]

    def loss(p: Any, s: Any, k: Any, xs: list[Any]) -> Any:
        it = iter(xs)
        full = [next(it) if m else x for x, m in zip(run.inputs, mapped, strict=True)]
        out, _ = run.on(p, s, full, k)
        return _total(out)

    return loss


class Candidate:
    """One strategy's forward and backward on the first `members` members, compiled ahead.

    `compile()` lowers and compiles (timed apart from the calls); each call runs the
    compiled step and waits for it.
    """

    def __init__(self, run: Run, members: int) -> None:
        batch = jax.tree_util.tree_leaves(run.params)[0].shape[0]
        head = lambda a: a if members >= batch else a[:members]  # noqa: E731
        mapped = [is_mapped(x, run.shared) for x in run.inputs]
        self.args = (
            jax.tree_util.tree_map(head, run.params),
            jax.tree_util.tree_map(head, run.state),
            None if run.keys is None else head(run.keys),
            [jax.tree_util.tree_map(head, x) for x, m in zip(run.inputs, mapped, strict=True) if m],
        )
        loss = members_loss(run)
        # allow_int: a pair's params may hold integer leaves (they get float0 gradients).
        self._step = jax.jit(jax.grad(loss, allow_int=True))
        self._compiled: Any = None

    def compile(self) -> None:
        self._compiled = self._step.lower(*self.args).compile()

    def __call__(self) -> None:
        if self._compiled is None:
            self.compile()
        jax.block_until_ready(self._compiled(*self.args))


def candidates(run: Run, options: Mapping[str, int | None]) -> Callable[[str, int], Candidate]:
    """``make(strategy, members)``: the `Candidate` of `run`'s members under one of `options`.

    `run`'s own strategy and chunk are not read: each candidate brings its own.
    """

    def make(strategy: str, members: int) -> Candidate:
        return Candidate(
            dataclasses.replace(run, strategy=strategy, chunk=options[strategy]), members
        )

    return make


class Runnable(Protocol):
    """What `within_budget` times: a compile, then calls."""

    def compile(self) -> None: ...

    def __call__(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Trial:
    """One candidate timed: on `members` members, its compile and its fastest call (s)."""

    strategy: str
    members: int
    compile: float
    call: float
    calls: int
    unrolled: bool = False

    def step(self, batch: int) -> float:
        """Seconds per call on all `batch` members, scaled from `members` (linear)."""
        return self.call * batch / self.members

    def compile_all(self, batch: int) -> float:
        """Seconds to compile the step on all `batch` members (the loop unrolls them)."""
        return self.compile * batch / self.members if self.unrolled else self.compile

    def job(self, batch: int, horizon: int) -> float:
        """Estimated seconds of `horizon` steps on all members, their compile included."""
        return self.compile_all(batch) + horizon * self.step(batch)


@dataclasses.dataclass
class Outcome:
    """What `within_budget` timed, skipped, and spent.

    Attributes:
        trials: each candidate's last timing (on all members if it reached that round).
        skipped: candidates not timed (or not timed on all members), with why.
        errors: candidates that raised, with the error.
        spent: seconds spent compiling and timing.
        budget: `SHARE` of `HORIZON` steps of the best candidate (s); 0 before any timing.
        best: the candidate whose `HORIZON` steps on all members, compile included, are
            estimated to take least, or None.
    """

    batch: int
    trials: dict[str, Trial] = dataclasses.field(default_factory=dict)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    errors: dict[str, BaseException] = dataclasses.field(default_factory=dict)
    spent: float = 0.0
    budget: float = 0.0
    best: str | None = None

    def settle(self, horizon: int, share: float) -> None:
        if self.trials:
            jobs = {n: t.job(self.batch, horizon) for n, t in self.trials.items()}
            self.best = min(jobs, key=lambda n: jobs[n])  # ties: the earlier candidate
            self.budget = share * horizon * self.trials[self.best].step(self.batch)


def within_budget(
    make: Callable[[str, int], Runnable],
    names: Sequence[str],
    batch: int,
    *,
    small: int = SMALL,
    horizon: int = HORIZON,
    share: float = SHARE,
    unrolled: Sequence[str] = ("loop",),
    clock: Callable[[], float] = time.perf_counter,
) -> Outcome:
    """Times `names` in order on `small` members while it pays; returns the `Outcome`.

    The first candidate is always timed (compile, then one call). Then the budget is
    `share` of `horizon` steps of the best so far, estimated on all members (a call on
    `small` members scaled by ``batch / small``), and time spent compiling counts: a
    candidate is timed only if about a compile (the dearest so far) and one call (the
    best's so far) still fit in what is left; another call of a candidate only if it fits
    too and the candidate is within `CLOSE` of the best (at most `REPEATS` calls), except
    that a second call is always taken when the first cost at most `CHEAP` of the compile
    (a first call carries one-time costs).
    Candidates within `CLOSE` of the best on `small` members are timed again on all
    `batch` members where that fits.

    The best is the candidate whose `horizon` steps and compile on all members are
    estimated to cost least: a step's compile is the candidate's own, except for
    `unrolled` candidates (the loop, which repeats the member's program once per member),
    whose compile is scaled like their calls.

    `clock` reads seconds; tests pass a fake one that moves only with each candidate's
    declared compile and call times, so a verdict does not depend on machine load.
    """
    out = Outcome(batch)
    small = max(1, min(small, batch))

    def fits(cost: float) -> bool:
        return out.spent + cost <= out.budget

    def time_one(name: str, members: int) -> None:
        start = clock()
        try:
            run = make(name, members)
            run.compile()
            compiled = clock()
            calls: list[float] = []
            while len(calls) < REPEATS:
                begun = clock()
                run()
                calls.append(clock() - begun)
                trial = Trial(
                    name, members, compiled - start, min(calls), len(calls), name in unrolled
                )
                # A first call carries one-time costs (allocation, thread start: 35 ms
                # before a 0.2 ms step); a second is always taken while cheap next to
                # the compile. Beyond that, another call only for a contender, and only
                # within the budget as it stands with this candidate counted.
                if len(calls) == 1 and calls[0] <= CHEAP * trial.compile:
                    continue
                rivals = [
                    t.call for n, t in out.trials.items() if n != name and t.members == members
                ]
                if rivals and trial.call > CLOSE * min(rivals):
                    break
                best = min([t.step(batch) for t in out.trials.values()] + [trial.step(batch)])
                if out.spent + (clock() - start) + calls[-1] > share * horizon * best:
                    break
        except Exception as error:
            out.errors[name] = error
            out.trials.pop(name, None)
        else:
            out.trials[name] = trial
        out.spent += clock() - start
        out.settle(horizon, share)

    for name in names:
        if out.trials:
            guess = max(t.compile for t in out.trials.values()) + out.trials[out.best or name].call
            if not fits(guess):
                out.skipped[name] = (
                    f"not timed: about {guess:.2f} s to compile and call once, more than the "
                    f"{max(out.budget - out.spent, 0.0):.2f} s left of the budget"
                )
                continue
        time_one(name, small)
    if small < batch and len(out.trials) > 1 and out.best is not None:
        fastest = out.trials[out.best].call
        close = [n for n, t in out.trials.items() if t.call <= CLOSE * fastest]
        if len(close) > 1:
            guess = sum(
                out.trials[n].compile_all(batch) + out.trials[n].step(batch) * 2 for n in close
            )
            if fits(guess):
                for name in close:
                    time_one(name, batch)
            else:
                for name in close:
                    out.skipped.setdefault(
                        name,
                        f"not timed on all {batch} members: about {guess:.2f} s for "
                        f"{', '.join(close)}, more than the "
                        f"{max(out.budget - out.spent, 0.0):.2f} s left of the budget",
                    )
    return out


def member_bytes(run: Run) -> int:
    """Estimated bytes of one of `run`'s members' forward and backward.

    From XLA's memory analysis of the compiled step (arguments, outputs, temporaries); a
    coarser sum where XLA has none. `run`'s strategy and chunk are not read: one member is
    measured as vmap runs it.
    """
    run = dataclasses.replace(run, strategy="vmap", chunk=None)
    p1, s1, k1, batched = abstract_members(run, 1)
    loss = members_loss(run)
    size = lambda tree: sum(  # noqa: E731
        int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree_util.tree_leaves(tree)
    )
    try:
        compiled = jax.jit(jax.grad(loss, allow_int=True)).lower(p1, s1, k1, batched).compile()
        stats = compiled.memory_analysis()
        if stats is None:
            raise TypeError("no memory analysis")
        return int(
            stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
        )
    except Exception:
        return 3 * size(p1) + size(s1) + size(batched)
