"""One accelerated model's decisions: per mode and input signature, which runner runs.

The adapters' wrappers ask `Decider.known(mode, signature)` on every call, and
`Decider.decide` when it has no runner yet. The first signature met in a mode reads its
verdict from the decision cache, or starts on the framework's cheapest correct fast path
(`rungs.STARTS`: eager torch; ``jax.jit``, verified against op-by-op JAX on that batch) and
serves its calls through a `Probation` runner: each call reads the clock once, and when a
candidate's expected payback is due (`dualtrain.accelerate.payback`) the ladder climbs
those candidates between two calls, against what serves now, and switches only to a
verified and faster one. When no candidate is left waiting, the decision is cached and the
calls go straight to the chosen runner. ``budget=math.inf`` climbs the whole ladder at the
first call, against eager (the behaviour before payback). A later new signature in the
same mode re-verifies that mode's choice on its batch (one comparison with eager, no
timing) and falls back to eager if it differs, and keeps eager when that choice is eager
(no candidate is compiled again per shape); beyond ``max_signatures`` per mode, calls
run eager. A runner that raises at run time is replaced by eager for its signature, for
good (`Decider.fall_back`), and the reason is recorded (and cached).
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from dualtrain.accelerate.compare import compare
from dualtrain.accelerate.decisions import DecisionCache, fingerprint
from dualtrain.accelerate.ladder import Trial, climb, describe_error
from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.payback import CompileCosts, Horizon, due_at, worth_trying
from dualtrain.accelerate.report import (
    CHOSEN,
    FAILED,
    PENDING,
    REJECTED,
    UNAVAILABLE,
    VERIFIED,
    Attempt,
    Decision,
    Explanation,
)
from dualtrain.accelerate.rungs import EAGER, PRIORS, STARTS, parse_backends
from dualtrain.accelerate.steady import SKIP, WINDOW, Steady, contradiction, margin, steady_of
from dualtrain.accelerate.verification import Verification

__all__ = ["Decider", "Probation", "RunnerTrial", "Verification", "deciding_seconds"]

# Seconds every Decider of this process has spent deciding (trials, cache reads, the start's
# verification), each on its own clock: what a DashBoard shows apart from step time.
_deciding = [0.0]
_deciding_lock = threading.Lock()


def deciding_seconds() -> float:
    """Seconds this process's ladders have spent deciding so far (monotone)."""
    return _deciding[0]


def _spent_deciding(seconds: float) -> None:
    if seconds > 0 and math.isfinite(seconds):
        with _deciding_lock:
            _deciding[0] += seconds


class RunnerTrial(Trial, Protocol):
    """A `Trial` whose built runner serves the real calls."""

    def runner(self) -> Callable[..., Any]:
        """The callable that runs the model under this rung (after `build`)."""

    def adopt(self, runner: Callable[..., Any]) -> None:
        """Serves `runner`, already built for this rung, instead of building (`build` no-ops)."""


TrialsFor = Callable[[Sequence[str]], list[RunnerTrial]]

_WAITING = "waits for its payback"
_STATUS_AFTER_S = 1.0  # a climb expected to take this long or more says so on stderr


def _verified_reason(verification: Verification) -> str:
    if verification.reason:  # eager could not run the batch: unverified
        return f"the start; {verification.reason}"
    return f"the start, verified against eager beside the job ({verification.seconds:.1f} s)"


def _say(line: str) -> None:
    sys.stderr.write(f"dualtrain.accelerate: {line}\n")
    sys.stderr.flush()


class Probation:
    """The runner of one (mode, signature) while candidates wait for their payback.

    Calls go to `current`; a call that finds a candidate due first lets the `Decider`
    climb (between two calls of the job). Not made directly: `Decider.decide` returns one.

    Attributes:
        current: the runner that serves now (the start rung's, then any rung that won).
        current_name: its rung.
        pending: the candidates not tried yet, in the ladder's order.
        expected: for a pending rival tried again after its decision was contradicted,
            its expected speed-up over `current` (else the prior's, `payback`).
        verifying: the start's `Verification` while it runs, else None.
        watching: "record" or "check" while the calls' steady time is watched (the
            decision is final then; `dualtrain.accelerate.steady`), else None.
        started: the clock reading at the mode's first call; calls: calls served since.
    """

    def __init__(
        self,
        decider: Decider,
        key: tuple[str, str],
        current: Callable[..., Any],
        current_name: str,
        pending: list[str],
        trials: TrialsFor,
        settled: Callable[[], None] | None,
    ) -> None:
        self.decider, self.key = decider, key
        self.current, self.current_name = current, current_name
        self.pending = pending
        self.expected: dict[str, float] = {}
        self.trials, self.settled = trials, settled
        self.over = 1.0  # the speed-up of `current` over the start rung
        self.started = decider.options.clock()
        self.calls = 0
        self.due = self.started  # re-read at the second call, when a step time is known
        self.verifying: Verification | None = None
        self.trusted = True  # False: a start eager could not check (nothing is cached then)
        self.watching: str | None = None
        self.recorded = False  # a steady time was recorded this run (at most once)
        self.final = False  # nothing waits or is watched: calls go straight to `current`
        self._last_call: float | None = None
        self._intervals: list[float] = []
        self._climbing = False
        self._lock = threading.RLock()

    def watch(self, how: str) -> None:
        """Watches the next ``SKIP + WINDOW`` calls' steady time ("record" or "check")."""
        self.watching, self._last_call, self._intervals = how, None, []

    def serving(self) -> Callable[..., Any]:
        """The runner this call goes to, after any climb that is due (counts the call).

        Adapters that treat runners apart (torch snapshots a call under a candidate, JAX
        guards donation) ask this first and call what it returns.
        """
        if self.final:
            self.calls += 1
            return self.current
        if self.watching is not None:
            self._watch_call()
        elif (
            self.calls
            and not self._climbing  # a trial's own call of the model, inside the climb
            and (self.verifying is not None or self.decider.options.clock() >= self.due)
        ):
            # Another thread's call waits for a climb in progress: under torch a trial
            # swaps the model's buffers and RNG state while it runs.
            with self._lock:
                if not self._climbing and not self.final and self.watching is None:
                    self._climbing = True
                    try:
                        self.decider.advance_probation(self)
                    finally:
                        self._climbing = False
        self.calls += 1
        return self.current

    def _watch_call(self) -> None:
        # Under the lock: calls from several threads take their intervals in turn.
        with self._lock:
            if self.watching is None or self._climbing:
                return
            now = self.decider.options.clock()
            if self._last_call is not None:
                self._intervals.append(max(now - self._last_call, 0.0))
            self._last_call = now
            if len(self._intervals) >= SKIP + WINDOW:
                self.decider.probation_watched(self, self._intervals)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.serving()(*args, **kwargs)


class Decider:
    """The per-model bookkeeping both adapters share.

    Args:
        framework: "torch" or "jax".
        backends: the user's ``backends=`` (validated by `parse_backends`).
        options: `LadderOptions`.
        approximations: lines describing what `patch_backprop` approximates.
    """

    def __init__(
        self,
        framework: str,
        backends: Any,
        options: LadderOptions,
        approximations: Sequence[str] = (),
    ) -> None:
        self.framework = framework
        self.backends = parse_backends(backends, framework)
        self.eager = EAGER[framework]
        self.options = options
        self.cache = DecisionCache(options.folder())
        self.costs = CompileCosts(options.folder(), framework)
        self._writing = threading.Lock()  # a decision's change and its cache write, as one
        self.start = STARTS[framework] if STARTS[framework] in self.backends else self.eager
        self.approximations = list(approximations)
        self.decisions: dict[tuple[str, str], Decision] = {}
        self._runners: dict[tuple[str, str], Callable[..., Any]] = {}
        self._keys: dict[tuple[str, str], str] = {}

    def explain(self) -> Explanation:
        """What was tried, chosen and rejected so far, and what is approximate."""
        return Explanation(self.backends, list(self.decisions.values()), self.approximations)

    def known(self, mode: str, signature: str) -> Callable[..., Any] | None:
        """The runner for an already decided (mode, signature), else None (a dict look-up)."""
        return self._runners.get((mode, signature))

    def serves_eager(self, runner: Callable[..., Any]) -> bool:
        """Whether `runner` runs the eager rung (itself, or a `Probation` serving it)."""
        if type(runner) is Probation:
            return runner.current_name == self.eager
        return runner is getattr(self, "_eager_runner", None)

    def decide(
        self,
        mode: str,
        signature: str,
        key_parts: dict[str, Any],
        trials: TrialsFor,
        settled: Callable[[], None] | None = None,
    ) -> Callable[..., Any]:
        """Decides (mode, signature) and returns its runner.

        Args:
            mode: "train" or "eval" (or a finer mode an adapter names).
            signature: the input signature, as text (shapes, dtypes, devices).
            key_parts: what else the verdict depends on (model structure, device, versions).
            trials: builds the trials for the given rung names, in the order given (the
                ladder's order, eager last), on this call's batch (a later climb of the
                mode's candidates uses it too: the batch is kept until they are decided).
            settled: called after a later climb changed the decision (an adapter's
                bookkeeping of what the chosen runner does, such as donation).
        """
        start = self.options.clock()
        key = (mode, signature)
        same_mode = [d for (m, _), d in self.decisions.items() if m == mode]
        if len(same_mode) >= self.options.max_signatures:
            return self._settle(key, self._eager_only(mode, signature, trials, start))
        cache_key = fingerprint(
            {
                "framework": self.framework,
                "mode": mode,
                "signature": signature,
                "backends": self.backends,
                "options": [self.options.rtol, self.options.atol, self.options.min_speedup],
                **key_parts,
            }
        )
        self._keys[key] = cache_key
        cached = self.cache.get(cache_key)
        waiting = [] if cached is None else [a.rung for a in cached.attempts if a.status == PENDING]
        if cached is not None and waiting and self.options.budget == math.inf:
            cached = None  # a decision still waiting for payback: climb it all now
        if cached is not None and cached.chosen in self.backends:
            built = self._build_chosen(cached.chosen, trials)
            if built is not None:
                cached.decide_s = self.options.clock() - start
                _spent_deciding(cached.decide_s)
                if waiting or self._rivals(cached):
                    # Candidates still wait (their payback is counted from here), or the
                    # run watches its steady time against the one recorded with the decision.
                    probation = Probation(self, key, built, cached.chosen, waiting, trials, settled)
                    probation.over = self._over_start(cached)
                    if not waiting:
                        probation.watch("check" if cached.steady_ms is not None else "record")
                    self.decisions[key] = cached
                    self._runners[key] = probation
                    return probation
                return self._settle(key, cached, built)
        first = same_mode[0] if same_mode else None
        if (
            first is not None
            and first.chosen == self.start != self.eager
            and self.options.budget != math.inf
        ):
            # The mode serves the start (jit): a new shape starts there too, verified
            # against eager beside the job, not before it (op by op takes seconds).
            decision, runner, verification = self._start_on(mode, signature, trials, cache_key)
            decision.decide_s = self.options.clock() - start
            if verification is not None and decision.chosen == self.start:
                _spent_deciding(decision.decide_s)
                probation = Probation(self, key, runner, decision.chosen, [], trials, settled)
                probation.verifying = verification
                self.decisions[key] = decision
                self._runners[key] = probation
                verification.start()
                return probation
        elif first is not None and first.chosen != self.eager:
            decision, runner = self._reverify(mode, signature, first.chosen, trials)
        elif first is not None:
            # The mode's ladder chose eager: a new shape (a last, smaller batch; variable
            # lengths) keeps it rather than compiling every candidate again, per shape.
            self._eager(trials)
            reason = f"{mode}'s choice (eager) holds for its new signatures"
            decision = Decision(mode, signature, self.eager, [Attempt(self.eager, CHOSEN, reason)])
            runner = self._eager_runner
            if any(a.status == PENDING for a in first.attempts):
                # Eager only for now: the mode's candidates still wait; not kept on disk,
                # so a later run decides this shape after them.
                decision.decide_s = self.options.clock() - start
                _spent_deciding(decision.decide_s)
                return self._settle(key, decision, runner)
        elif self.options.budget == math.inf:
            decision, runner = self._climb(mode, signature, trials)
        else:
            decision, runner, verification = self._start_on(mode, signature, trials, cache_key)
            pending = [
                n for n in self.backends if n not in (decision.chosen, self.start, self.eager)
            ]
            decision.decide_s = self.options.clock() - start
            if (pending or verification is not None) and decision.chosen == self.start:
                _spent_deciding(decision.decide_s)
                decision.attempts.extend(Attempt(n, PENDING, _WAITING) for n in pending)
                probation = Probation(self, key, runner, decision.chosen, pending, trials, settled)
                probation.verifying = verification
                self.decisions[key] = decision
                self._runners[key] = probation
                if verification is None:
                    self.cache.put(cache_key, decision)  # a later run starts here, waiting
                else:
                    verification.start()
                return probation
        decision.decide_s = self.options.clock() - start
        _spent_deciding(decision.decide_s)
        self.cache.put(cache_key, decision)
        if not self._rivals(decision):
            return self._settle(key, decision, runner)
        # Final, with rivals a later run may try again: its steady time is recorded first.
        probation = Probation(self, key, runner, decision.chosen, [], trials, settled)
        probation.over = self._over_start(decision)
        probation.watch("record")
        return self._settle(key, decision, probation)

    def fall_back(self, mode: str, signature: str, error: BaseException) -> Callable[..., Any]:
        """Records that the runner of (mode, signature) failed; eager serves it from now on."""
        key = (mode, signature)
        decision = self.decisions[key]
        reason = (
            f"{decision.chosen} failed at run time ({describe_error(error)}); eager from now on"
        )
        decision.events.append(reason)
        attempts = [
            replace(a, status=FAILED, reason=reason) if a.rung == decision.chosen else a
            for a in decision.attempts
        ]
        # Eager's own line (the reference) becomes the chosen one; one line per rung.
        lines = [i for i, a in enumerate(attempts) if a.rung == self.eager]
        if lines:
            attempts[lines[-1]] = replace(
                attempts[lines[-1]], status=CHOSEN, reason="after a run-time failure"
            )
        else:
            attempts.append(Attempt(self.eager, CHOSEN, "after a run-time failure"))
        for attempt in attempts:
            if attempt.status == PENDING:
                attempt.status, attempt.reason = REJECTED, "not tried: " + reason
        with self._writing:
            decision.attempts = attempts
            decision.chosen = self.eager
            decision.from_cache = False
            if key in self._keys:
                self.cache.put(self._keys[key], decision)
        eager = self._eager_runner
        self._runners[key] = eager
        return eager

    # -- internals ------------------------------------------------------------------------

    def _start_on(
        self, mode: str, signature: str, trials: TrialsFor, cache_key: str
    ) -> tuple[Decision, Any, Verification | None]:
        """The start rung for a mode's first signature, and its verification if not eager.

        The start is built and run on this batch now (the job needs it anyway); eager's
        run of the same batch, the reference, goes on in a `Verification` thread.
        """
        if self.start == self.eager:
            self._eager(trials)
            attempt = Attempt(self.eager, CHOSEN, "the start: candidates wait for their payback")
            decision = Decision(mode, signature, self.eager, [attempt], speedup_over=self.eager)
            return decision, self._eager_runner, None
        reference = self._eager(trials)
        (trial,) = trials([self.start])
        clock = self.options.clock
        began = clock()
        try:
            trial.build()
            names, got = trial.check()
        except Exception as failure:  # UnavailableError too: eager serves, decided
            trial.release()
            attempt = Attempt(self.start, FAILED, "the start: " + describe_error(failure))
            attempt.compile_s = clock() - began
            decision = Decision(
                mode, signature, self.eager, [attempt, Attempt(self.eager, CHOSEN, "the reference")]
            )
            return decision, self._eager_runner, None
        attempt = Attempt(self.start, CHOSEN, "the start; verifying against eager beside the job")
        attempt.compile_s = clock() - began
        self.costs.record(self.start, attempt.compile_s)
        decision = Decision(mode, signature, self.start, [attempt], speedup_over=self.start)

        def remember(verification: Verification) -> None:
            # In the verifying thread: the decision as the next call will read it, kept now
            # (a job that ends before that call still spares the next run its op-by-op run).
            with self._writing:
                if self.decisions.get((mode, signature)) is not decision:
                    return
                if decision.chosen != self.start:  # fallen back meanwhile
                    return
                kept = Decision.from_dict(decision.to_dict())
                kept.attempts[0].reason = _verified_reason(verification)
                kept.attempts[0].max_error = verification.max_error
                self.cache.put(cache_key, kept)

        verification = Verification(reference, names, got, self.options, remember)
        return decision, trial.runner(), verification

    def _verified(self, probation: Probation) -> bool:
        """Reads the start's verdict; False when the start differed (eager serves, final)."""
        verification = probation.verifying
        assert verification is not None
        probation.verifying = None
        decision = self.decisions[probation.key]
        start = next(a for a in decision.attempts if a.rung == probation.current_name)
        start.max_error = verification.max_error
        mode = probation.key[0]
        if verification.ok:
            start.reason = _verified_reason(verification)  # cached by the thread already
            probation.trusted = verification.verified  # unverified: never kept on disk
            return True
        reason = f"differs from eager: {verification.reason}"
        start.status, start.reason = REJECTED, reason
        for attempt in decision.attempts:
            if attempt.status == PENDING:
                attempt.status, attempt.reason = REJECTED, "not tried: the start differs from eager"
        decision.attempts.append(Attempt(self.eager, CHOSEN, "after the start differed"))
        decision.chosen = self.eager
        event = (
            f"{probation.current_name} {reason} (found beside the job; its first "
            f"{probation.calls} calls were {probation.current_name}'s); eager serves from now on"
        )
        decision.events.append(event)
        _say(f"{mode}: {event}")  # always: a switch for correctness is never silent
        probation.current, probation.current_name = self._eager_runner, self.eager
        probation.pending = []
        return False

    def advance_probation(self, probation: Probation) -> None:
        """Climbs the candidates of `probation` that are due, if any; schedules the rest."""
        options, clock = self.options, self.options.clock
        if probation.verifying is not None:
            if not probation.verifying.done:
                return  # nothing is tried on a start not yet verified
            self._verified(probation)
        now = clock()
        horizon = Horizon(now - probation.started, probation.calls, options.budget)
        estimates = {n: self.costs.estimate(n) for n in probation.pending}
        hoped = {n: self._hoped(probation, n) for n in probation.pending}
        due = [
            n
            for n in probation.pending
            if worth_trying(n, horizon, estimates[n], options.warm_steps, expected=hoped[n])
        ]
        if due:
            expected = sum(estimates[n] for n in due)
            loud = options.status and expected >= _STATUS_AFTER_S
            mode = probation.key[0]
            if loud:
                _say(
                    f"trying {', '.join(due)} for {mode} after {probation.calls} calls "
                    f"({horizon.elapsed_s:.0f} s); expected build ~{expected:.0f} s, "
                    "then the job goes on"
                )
            spent = clock()
            try:
                self._climb_due(probation, due)
            except Exception as error:  # the climb, not the job: what serves goes on serving
                self._climb_failed(probation, due, error)
            if loud:
                _say(
                    f"{probation.current_name} serves {mode} "
                    f"(tried in {clock() - spent:.1f} s; explain() says more)"
                )
        hoped = {n: self._hoped(probation, n) for n in probation.pending}  # after the climb
        waiting: list[str] = []
        if options.budget is None:  # within a budget the horizon only shrinks: never later
            # A rung whose prior cannot beat what serves now (after this climb) never will.
            waiting = [
                n
                for n in probation.pending
                if n not in due
                and math.isfinite(
                    due_at(n, horizon.step_s, estimates[n], options.warm_steps, expected=hoped[n])
                )
            ]
        probation.pending = waiting
        decision = self.decisions[probation.key]
        if waiting:
            step_s = horizon.step_s
            next_due = min(
                due_at(n, step_s, estimates[n], options.warm_steps, expected=hoped[n])
                for n in waiting
            )
            probation.due = probation.started + next_due
            for attempt in decision.attempts:
                if attempt.status == PENDING:
                    when = due_at(
                        attempt.rung,
                        step_s,
                        estimates[attempt.rung],
                        options.warm_steps,
                        expected=self._hoped(probation, attempt.rung),
                    )
                    if attempt.rung in waiting:
                        attempt.reason = (
                            f"{_WAITING}: worth trying after ~{when:.0f} s of these calls "
                            f"(build ~{estimates[attempt.rung]:.1f} s)"
                        )
                    else:
                        attempt.status = REJECTED
                        attempt.reason = (
                            f"not tried: its prior cannot beat {probation.current_name}"
                        )
            return
        # Nothing left waiting: the decision is final; calls go straight to the runner.
        for attempt in decision.attempts:
            if attempt.status == PENDING:
                attempt.status = REJECTED
                attempt.reason = (
                    "not tried: it could not pay back its build within the budget"
                    if options.budget is not None
                    else f"not tried: its prior cannot beat {probation.current_name}"
                )
        key = self._keys.get(probation.key)
        if key is not None and probation.trusted:
            with self._writing:
                self.cache.put(key, decision)
        if probation.settled is not None:
            probation.settled()
        if not probation.recorded and probation.trusted and self._rivals(decision):
            probation.watch("record")  # what a later run's steady time is held against
            return
        self._final(probation)

    def _final(self, probation: Probation) -> None:
        probation.final, probation.watching = True, None
        if self._runners.get(probation.key) is probation:  # not after a fall_back meanwhile
            self._runners[probation.key] = probation.current

    def _start_in_base(self, decision: Decision) -> float | None:
        """The start's speed-up in the unit of `decision`'s speed-ups.

        1.0 when they are over the start; None when they are over eager and the start was
        not timed (it differed from eager, failed or compiled over the budget).
        """
        if decision.speedup_over in ("", self.eager) and self.start != self.eager:
            return next(
                (a.speedup for a in decision.attempts if a.rung == self.start and a.speedup), None
            )
        return 1.0

    def _hoped(self, probation: Probation, rung: str) -> float:
        """The speed-up over what serves expected of `rung` (see `payback.worth_trying`).

        What a contradiction set, else the prior over what serves; the start's prior is
        1.0 (``PRIORS["JIT"]`` is jit's gain over op by op, not over the start).
        """
        if rung in probation.expected:
            return probation.expected[rung]
        return (1.0 if rung == self.start else PRIORS[rung][1]) / probation.over

    def _over_start(self, decision: Decision) -> float:
        """The chosen rung's speed-up over the start (1.0 when it is the start, or unknown)."""
        speedups = {a.rung: a.speedup for a in decision.attempts if a.speedup}
        chosen = speedups.get(decision.chosen)
        base = self._start_in_base(decision)
        if decision.chosen == self.start or chosen is None or base is None:
            return 1.0  # unknown: what serves is judged as if it were the start
        return chosen / base

    def _rivals(self, decision: Decision) -> list[str]:
        """The rungs a contradicted decision tries again, in the ladder's order.

        Those verified and timed that lost (a verdict on speed, which the machine's state
        can turn), the start among them when another rung won it; never a rung rejected
        for its results, and never op by op when it is not the start.
        """
        timed = {
            a.rung
            for a in decision.attempts
            if a.speedup is not None and a.status in (VERIFIED, REJECTED, PENDING)
        }
        # The start, timed when a winner took over from it (then "verified"; "pending" or
        # "rejected" by its prior after a contradiction): its line has a step time. Rejected
        # for its results or failed, it never served a timed call and has none.
        timed |= {
            a.rung
            for a in decision.attempts
            if a.rung == self.start
            and a.status in (VERIFIED, REJECTED, PENDING)
            and a.step_ms is not None
        }
        timed.discard(decision.chosen)
        if self.eager != self.start:
            timed.discard(self.eager)  # op by op is the reference, never a contender
        return [n for n in self.backends if n in timed]

    def probation_watched(self, probation: Probation, intervals: list[float]) -> None:
        """Ends a watch: records the steady time, or checks it against the record.

        A check that contradicts the record beyond its margin puts the decision's rivals
        back on probation (`_rivals`), each expected to win back at least the slowdown
        seen; the new steady time is recorded either way it contradicts, so the next run
        in the same state does not re-decide again.
        """
        how, probation.watching = probation.watching, None
        try:
            now = steady_of(intervals)
        except ValueError:  # never the job's error: the decision simply holds
            self._final(probation)
            return
        decision = self.decisions[probation.key]
        recorded = (
            None
            if decision.steady_ms is None
            else Steady(decision.steady_ms, decision.steady_spread or 0.0)
        )
        cache_key = self._keys.get(probation.key)
        if how == "record" or recorded is None:
            probation.recorded = True
            with self._writing:
                decision.steady_ms, decision.steady_spread = now.ms, now.spread
                if cache_key is not None and probation.trusted:
                    self.cache.put(cache_key, decision)
            self._final(probation)
            return
        chosen = next((a for a in decision.attempts if a.rung == decision.chosen), None)
        low = None
        base = self._start_in_base(decision)
        if (
            chosen is not None
            and chosen.speedup_low is not None
            and decision.chosen != self.start
            and base is not None
        ):
            low = chosen.speedup_low / base  # at worst, over the start
        allowed = margin(recorded, now, low)
        ratio = contradiction(recorded, now, allowed)
        if ratio is None:
            self._final(probation)  # within the margin: the decision holds, nothing written
            return
        rivals = self._rivals(decision)
        event = (
            f"this run's steady calls take {now.ms:.3f} ms, {ratio:.2f}x the "
            f"{recorded.ms:.3f} ms recorded with the decision (beyond its {allowed:.0%} "
            "margin)"
        )
        expected = {}
        for name in rivals:
            prior = self._hoped(probation, name)
            # Slower than recorded: a rival may win back what was lost.
            expected[name] = max(prior, ratio) if ratio > 1.0 else prior
        tried = [n for n in rivals if expected[n] > 1.0]
        event += (
            f": {', '.join(tried)} "
            f"{'waits for its' if len(tried) == 1 else 'wait for their'} payback again"
            if tried
            else ": no rival can win it back; the decision holds"
        )
        with self._writing:
            decision.events.append(event)
            decision.steady_ms, decision.steady_spread = now.ms, now.spread
            decision.from_cache = False
            lines = {a.rung: a for a in decision.attempts}
            for name in tried:
                attempt = lines.get(name)
                if attempt is None:
                    decision.attempts.append(Attempt(name, PENDING, _WAITING + " again"))
                else:
                    attempt.status, attempt.reason = PENDING, _WAITING + " again"
            if cache_key is not None and probation.trusted:
                self.cache.put(cache_key, decision)
        if not tried:
            probation.recorded = True
            self._final(probation)
            return
        # Once they are decided, the steady time under what then serves is recorded.
        probation.pending, probation.expected = tried, {n: expected[n] for n in tried}
        probation.due = self.options.clock()  # the next call weighs their payback

    def _climb_failed(self, probation: Probation, due: list[str], error: Exception) -> None:
        """Records a climb that raised; what served goes on serving.

        The reference's rerun of the kept batch, or an out-of-memory beside a compile: the
        due rungs are marked failed (never tried again this run), the job is not failed.
        """
        decision = self.decisions[probation.key]
        serving = probation.current_name
        reason = f"its climb failed ({describe_error(error)}); {serving} serves on"
        for attempt in decision.attempts:
            if attempt.rung in due:
                attempt.status, attempt.reason = FAILED, reason
        decision.events.append(f"tried {', '.join(due)} after {probation.calls} calls: {reason}")
        decision.from_cache = False

    def _climb_due(self, probation: Probation, due: list[str]) -> None:
        clock = self.options.clock
        start = clock()
        built = probation.trials([probation.current_name, *due])
        reference, candidates = built[0], built[1:]
        reference.adopt(probation.current)
        chosen, attempts = climb(reference, candidates, self.options)
        for attempt in attempts:
            if attempt.compile_s is not None and attempt.status != UNAVAILABLE:
                self.costs.record(attempt.rung, attempt.compile_s)
        decision = self.decisions[probation.key]
        measured = next(a for a in attempts if a.rung == reference.name)
        tried = {a.rung for a in attempts} - {reference.name}
        kept = [a for a in decision.attempts if a.rung not in tried]
        for attempt in kept:
            if attempt.rung == reference.name and measured.step_ms is not None:
                attempt.step_ms = measured.step_ms  # what it cost beside the candidates
        # Speed-ups over the start (`over`: what served, over the start), then in the
        # decision's own unit (a whole-ladder climb's were over eager).
        base = self._start_in_base(decision) or 1.0
        over_start = {}
        for attempt in attempts:
            if attempt.rung != reference.name and attempt.speedup is not None:
                over_start[attempt.rung] = attempt.speedup * probation.over
                attempt.speedup = over_start[attempt.rung] * base
                if attempt.speedup_low is not None:
                    attempt.speedup_low *= probation.over * base
        if chosen != probation.current_name:
            for attempt in kept:
                if attempt.status == CHOSEN:
                    attempt.status = "verified"
                    attempt.reason = f"{attempt.reason}; then {chosen} won"
            probation.current = next(t.runner() for t in candidates if t.name == chosen)
            probation.current_name = chosen
            probation.over = over_start.get(chosen, probation.over)
            probation.expected = {}  # they were expected over what served before
            decision.chosen = chosen
            # Its steady time was the old runner's: the next run records, not checks.
            decision.steady_ms = decision.steady_spread = None
        decision.from_cache = False
        # the reference's own line: the one kept from before (it served until now)
        decision.attempts = [*kept, *(a for a in attempts if a.rung != reference.name)]
        decision.decide_s += clock() - start
        _spent_deciding(clock() - start)
        cache_key = self._keys.get(probation.key)
        if cache_key is not None and probation.trusted:
            with self._writing:
                self.cache.put(cache_key, decision)  # what won so far, and what still waits
        decision.events.append(
            f"tried {', '.join(due)} after {probation.calls} calls "
            f"({start - probation.started:.1f} s): {chosen} serves"
        )

    _eager_runner: Callable[..., Any]

    def _settle(
        self, key: tuple[str, str], decision: Decision, runner: Callable[..., Any] | None = None
    ) -> Callable[..., Any]:
        self.decisions[key] = decision
        self._runners[key] = runner if runner is not None else self._eager_runner
        return self._runners[key]

    def _eager(self, trials: TrialsFor) -> RunnerTrial:
        (eager,) = trials([self.eager])
        eager.build()
        self._eager_runner = eager.runner()
        return eager

    def _build_chosen(self, name: str, trials: TrialsFor) -> Callable[..., Any] | None:
        self._eager(trials)
        if name == self.eager:
            return self._eager_runner
        (trial,) = trials([name])
        try:
            trial.build()
        except Exception:  # the cached rung no longer builds here: decide afresh
            trial.release()
            return None
        return trial.runner()

    def _climb(self, mode: str, signature: str, trials: TrialsFor) -> tuple[Decision, Any]:
        built = trials(self.backends)
        reference = built[-1]
        reference.build()  # eager serves whatever the ladder finds (climb builds it lazily)
        chosen, attempts = climb(reference, built[:-1], self.options)
        self._eager_runner = reference.runner()
        runner = next(t.runner() for t in built if t.name == chosen)
        return Decision(mode, signature, chosen, attempts, speedup_over=self.eager), runner

    def _reverify(
        self, mode: str, signature: str, name: str, trials: TrialsFor
    ) -> tuple[Decision, Any]:
        reference = self._eager(trials)
        names, want = reference.check()
        (trial,) = trials([name])
        start = self.options.clock()
        try:
            trial.build()
            got_names, got = trial.check()
            verdict = compare(names, want, got, self.options)
            ok, reason = verdict.ok and got_names == names, verdict.reason
            if got_names != names:
                reason = "results named differently"
            error = verdict.max_error
        except Exception as failure:  # UnavailableError too
            ok, reason, error = False, describe_error(failure), None
        spent = self.options.clock() - start
        if ok:
            attempt = Attempt(name, CHOSEN, f"{mode}'s choice, re-verified on this signature")
            attempt.compile_s, attempt.max_error = spent, error
            return Decision(mode, signature, name, [attempt]), trial.runner()
        trial.release()
        attempt = Attempt(name, REJECTED, f"{mode}'s choice differs here: {reason}")
        attempt.compile_s = spent
        return Decision(
            mode, signature, self.eager, [attempt, Attempt(self.eager, CHOSEN, "the reference")]
        ), self._eager_runner

    def _eager_only(self, mode: str, signature: str, trials: TrialsFor, start: float) -> Decision:
        self._eager(trials)
        reason = f"more than {self.options.max_signatures} signatures in {mode} mode: eager"
        decision = Decision(mode, signature, self.eager, [Attempt(self.eager, CHOSEN, reason)])
        decision.decide_s = self.options.clock() - start
        return decision
