"""One accelerated model's decisions: per mode and input signature, which runner runs.

The adapters' wrappers ask `Decider.known(mode, signature)` on every call, and
`Decider.decide` when it has no runner yet. The first signature met in a mode climbs the
whole ladder (or reads its verdict from the decision cache); a later new signature in the
same mode re-verifies that mode's choice on its batch (one comparison with eager, no
timing) and falls back to eager if it differs, and keeps eager when that choice is eager
(no candidate is compiled again per shape); beyond ``max_signatures`` per mode, calls
run eager. A runner that raises at run time is replaced by eager for its signature, for
good (`Decider.fall_back`), and the reason is recorded (and cached).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from dualtrain.accelerate.compare import compare
from dualtrain.accelerate.decisions import DecisionCache, fingerprint
from dualtrain.accelerate.ladder import Trial, climb, describe_error
from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import (
    CHOSEN,
    FAILED,
    REJECTED,
    Attempt,
    Decision,
    Explanation,
)
from dualtrain.accelerate.rungs import EAGER, parse_backends

__all__ = ["Decider", "RunnerTrial"]


class RunnerTrial(Trial, Protocol):
    """A `Trial` whose built runner serves the real calls."""

    def runner(self) -> Callable[..., Any]:
        """The callable that runs the model under this rung (after `build`)."""


TrialsFor = Callable[[Sequence[str]], list[RunnerTrial]]


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

    def decide(
        self,
        mode: str,
        signature: str,
        key_parts: dict[str, Any],
        trials: TrialsFor,
    ) -> Callable[..., Any]:
        """Decides (mode, signature) and returns its runner.

        Args:
            mode: "train" or "eval" (or a finer mode an adapter names).
            signature: the input signature, as text (shapes, dtypes, devices).
            key_parts: what else the verdict depends on (model structure, device, versions).
            trials: builds the trials for the given rung names, in the order given (the
                ladder's order, eager last).
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
        if cached is not None and cached.chosen in self.backends:
            built = self._build_chosen(cached.chosen, trials)
            if built is not None:
                cached.decide_s = self.options.clock() - start
                return self._settle(key, cached, built)
        if same_mode and same_mode[0].chosen != self.eager:
            decision, runner = self._reverify(mode, signature, same_mode[0].chosen, trials)
        elif same_mode:
            # The mode's ladder chose eager: a new shape (a last, smaller batch; variable
            # lengths) keeps it rather than compiling every candidate again, per shape.
            self._eager(trials)
            reason = f"{mode}'s choice (eager) holds for its new signatures"
            decision = Decision(mode, signature, self.eager, [Attempt(self.eager, CHOSEN, reason)])
            runner = self._eager_runner
        else:
            decision, runner = self._climb(mode, signature, trials)
        decision.decide_s = self.options.clock() - start
        self.cache.put(cache_key, decision)
        return self._settle(key, decision, runner)

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
        decision.attempts = attempts
        decision.chosen = self.eager
        decision.from_cache = False
        if key in self._keys:
            self.cache.put(self._keys[key], decision)
        eager = self._eager_runner
        self._runners[key] = eager
        return eager

    # -- internals ------------------------------------------------------------------------

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
        chosen, attempts = climb(reference, built[:-1], self.options)
        self._eager_runner = reference.runner()
        runner = next(t.runner() for t in built if t.name == chosen)
        return Decision(mode, signature, chosen, attempts), runner

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
