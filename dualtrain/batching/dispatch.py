"""Measured dispatch: which strategy runs the members, chosen by timing and cached.

The adapters hand this module one callable per candidate strategy (each runs the members
once and waits for the device); `measure` times them and `Decision` records the winner.
Decisions are cached per (backend, architecture, input shapes and dtypes, device, mode,
member count, chunk), so a second model of the same shape is not timed again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import platform
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dualtrain.atomic import atomic_target
from dualtrain.batching import members
from dualtrain.caches import cache_folder
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.version import __version__

__all__ = [
    "CACHE",
    "FULL_ROUNDS",
    "PRELIMINARY",
    "PRELIMINARY_FROM",
    "PRUNE",
    "Decision",
    "DecisionCache",
    "candidates",
    "chunk_size",
    "decide",
    "default_chunk",
    "explain_text",
    "measure",
    "plan",
]

# The most members one chunk holds when "chunked" (torch) runs without a memory budget.
CHUNK = 8
# From PRELIMINARY_FROM members, "auto" first times the candidates on PRELIMINARY of them
# (a preliminary round) and times only those within PRUNE of the best there on every
# member: some strategies grow faster than linearly in the member count (XLA:CPU's
# gradient of a vmapped conv: 2 s a call at 8 members, minutes at 128), and timing them at
# full size would cost more than any training step saves. Below, the round on 8 members
# costs a third or more of the round on all of them and prunes too little to pay for it
# (16 members of a small CNN: 0.87 s of a 2.1 s decision).
PRELIMINARY = 8
PRELIMINARY_FROM = 4 * PRELIMINARY
PRUNE = 1.5
FULL_ROUNDS = 2  # timed rounds on every member, after one warm call each
# Strategies a backend offers only for some models (the adapter passes them as `extra`).
OPTIONAL = frozenset({"stacked"})
_FORMAT = 1  # bump when a stored decision's fields change meaning


@dataclasses.dataclass(frozen=True)
class Decision:
    """How a batched model runs its members, and why.

    Attributes:
        strategy: the strategy that runs (one of the backend's `Strategies.names`).
        chunk: members per vmapped chunk for "chunked"/"map"; None means all at once
            (vmap) or one at a time (loop, map without a budget).
        reason: ``"forced"`` (``strategy=`` named it), ``"measured"``, ``"cached"`` (measured
            earlier for the same key), or ``"default"`` (JAX under a trace, not measured).
        timings: seconds per call of each candidate measured, fastest first.
        errors: candidates that raised, with the error's text.
        preliminary: candidates dropped in the preliminary round, with their seconds per
            call on `PRELIMINARY` members.
        step: seconds of one whole training step under the chosen strategy (forward,
            backward and an Adam step over the stacked parameters); None when not measured
            (forced, inference, or a backend that does not time it).
        separate: seconds the same step takes as separate trainings: one member alone
            (its own contiguous parameters and its own Adam) times the member count.
        notes: sentences `explain` prints: why a strategy was chosen without timing
            (JAX's rule), what a timing cost.
    """

    strategy: str
    chunk: int | None = None
    reason: str = "forced"
    timings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    errors: Mapping[str, str] = dataclasses.field(default_factory=dict)
    preliminary: Mapping[str, float] = dataclasses.field(default_factory=dict)
    step: float | None = None
    separate: float | None = None
    notes: tuple[str, ...] = ()


class DecisionCache:
    """Decisions by key, in memory and on disk; `CACHE` is the one both adapters share.

    A measured decision is also written to ``cache_folder("batching")`` (one small JSON
    file per key, named by a hash of the key and of Python's, the machine's and
    dualtrain's versions; the adapters put their framework's version in the key), so the
    next process with the same key skips the timing. Files are written to a temporary
    name and renamed; one that does not parse, or holds another key, is ignored. A folder
    that cannot be written costs the next run its timing, nothing more. A cached decision
    only picks among strategies that compute the same thing: whatever a strategy must
    verify is verified again in each process.
    """

    def __init__(self, folder: Path | Callable[[], Path | None] | None = None) -> None:
        self._store: dict[tuple[Any, ...], Decision] = {}
        self._lock = threading.Lock()
        self._folder = folder

    def folder(self) -> Path | None:
        """Where decisions are kept on disk (None: memory only)."""
        try:
            return self._folder() if callable(self._folder) else self._folder
        except (RuntimeError, KeyError, OSError):  # no home directory to put a cache in
            return None

    def _path(self, key: tuple[Any, ...]) -> tuple[Path, str] | None:
        folder = self.folder()
        if folder is None:
            return None
        text = json.dumps(
            {
                "format": _FORMAT,
                "python": sys.version.split()[0],
                "machine": platform.machine(),
                "dualtrain": __version__,
                "key": key,
            },
            sort_keys=True,
            default=repr,
        )
        name = hashlib.sha256(text.encode()).hexdigest()[:32]
        return folder / f"{name}.json", text

    def get(self, key: tuple[Any, ...]) -> Decision | None:
        """The decision for `key`: from memory, else from disk, else None."""
        with self._lock:
            found = self._store.get(key)
        if found is not None:
            return found
        where = self._path(key)
        if where is None:
            return None
        path, text = where
        try:
            data = json.loads(path.read_text())
            if data.get("key") != text:
                return None
            fields = dict(data["decision"])
            fields["notes"] = tuple(fields.get("notes", ()))  # JSON keeps a list
            found = Decision(**fields)
            if not _well_formed(found):
                return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        with self._lock:
            self._store.setdefault(key, found)
        return found

    def put(self, key: tuple[Any, ...], decision: Decision) -> None:
        """Keeps `decision` for `key` in memory and on disk."""
        with self._lock:
            self._store[key] = decision
        where = self._path(key)
        if where is None:
            return
        path, text = where
        data = {"key": text, "decision": dataclasses.asdict(decision)}
        try:
            text = json.dumps(data, indent=1)
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_target(path) as tmp:
                Path(tmp).write_text(text)
        except (OSError, TypeError, ValueError):  # unwritable, or a value JSON cannot hold
            return

    def clear(self) -> None:
        """Forgets every decision, in memory and on disk (after a change of machine load)."""
        with self._lock:
            self._store.clear()
        folder = self.folder()
        if folder is not None and folder.is_dir():
            for path in folder.glob("*.json"):
                try:
                    path.unlink(missing_ok=True)
                except OSError:  # read-only: the files stay, as a put there would fail
                    continue

    def __len__(self) -> int:
        return len(self._store)


CACHE = DecisionCache(lambda: cache_folder("batching"))


def _well_formed(decision: Decision) -> bool:
    """A decision read from disk has the fields' types (a file edited or from elsewhere)."""

    def seconds(table: object) -> bool:
        return isinstance(table, dict) and all(
            isinstance(k, str) and isinstance(v, int | float) for k, v in table.items()
        )

    def optional_seconds(value: object) -> bool:
        return value is None or isinstance(value, int | float)

    return (
        isinstance(decision.strategy, str)
        and (decision.chunk is None or type(decision.chunk) is int)
        and isinstance(decision.reason, str)
        and seconds(decision.timings)
        and seconds(decision.preliminary)
        and isinstance(decision.errors, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in decision.errors.items())
        and optional_seconds(decision.step)
        and optional_seconds(decision.separate)
        and all(isinstance(n, str) for n in decision.notes)
    )


def default_chunk(batch: int) -> int:
    """Members per chunk without a budget: even chunks of at most `CHUNK` members.

    At least two chunks: one chunk of every member would be vmap itself.
    """
    chunks = max(2, math.ceil(batch / CHUNK))
    return max(1, math.ceil(batch / chunks))


def chunk_size(batch: int, member_bytes: int, memory_budget: int | None) -> int:
    """How many members one vmapped call may hold under `memory_budget` bytes.

    Args:
        batch: the member count.
        member_bytes: the estimated footprint of one member's call (parameters, gradients,
            saved activations, outputs).
        memory_budget: bytes one call may use; None means no limit.

    Raises:
        ArgumentError: the budget cannot hold one member.
    """
    if memory_budget is None:
        return batch
    fits = memory_budget // max(int(member_bytes), 1)
    if fits < 1:
        raise ArgumentError(
            f"memory_budget must hold at least one member, about {int(member_bytes):,} bytes "
            f"here; got memory_budget={memory_budget}"
        )
    return int(min(batch, fits))


def plan(
    backend: members.Strategies | str, strategy: str, batch: int, chunk: int
) -> tuple[str, int | None]:
    """The strategy and chunk that run for a requested strategy under a budget's `chunk`.

    A budget smaller than the whole batch turns vmap into its chunked form ("chunked" under
    torch, ``lax.map`` over chunks under JAX: `Strategies.chunked`); the loop needs no chunk.
    `backend` is the adapter's `Strategies` (or a backend's name, for those it declared).
    """
    if strategy == "loop":
        return "loop", None
    if strategy == "stacked":  # every member at once, as vmap: under a budget, in chunks
        return ("stacked", None) if chunk >= batch else ("chunked", min(chunk, batch))
    declared = members.strategies_of(backend)
    if strategy == "vmap":
        return ("vmap", None) if chunk >= batch else (declared.chunked, chunk)
    if declared.even_chunks:  # "chunked": the budget's chunk, or even chunks of CHUNK
        return declared.chunked, min(chunk, default_chunk(batch))
    return declared.chunked, chunk if chunk < batch else None


def candidates(
    backend: members.Strategies | str, batch: int, chunk: int, extra: tuple[str, ...] = ()
) -> dict[str, int | None]:
    """The strategies "auto" measures, with their chunks; duplicates are left out.

    `extra` names strategies the model allows beyond the backend's general ones (torch's
    "stacked", for a Sequential of the layers it runs), measured first.
    """
    out: dict[str, int | None] = {}
    for name in (*extra, "vmap", members.strategies_of(backend).chunked, "loop"):
        strategy, size = plan(backend, name, batch, chunk)
        if strategy == "chunked" and size is not None and size >= batch:
            continue  # one chunk of every member is vmap itself
        out.setdefault(strategy, size)
    return out


def measure(
    runs: Mapping[str, Callable[[], object]],
    *,
    repeats: int = 3,
    budget: float = 3.0,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[dict[str, float], dict[str, BaseException]]:
    """Times each candidate; returns ``(seconds per call, errors)``.

    Each candidate runs once untimed (compilation, caches, allocation), then up to
    `repeats` rounds taken round-robin so a change of machine load touches every candidate
    alike; a candidate's time is its fastest round. One more than `PRUNE` times slower than
    the best after a round is not run again (the preliminary round's rule: a warm call that
    far behind does not come back). No round starts once the rounds have taken
    `budget` seconds (slow calls need fewer samples to be told apart). A candidate that
    raises is dropped with its error.

    `clock` reads seconds (`time.perf_counter` by default); tests pass a fake one that moves
    only with a candidate's declared work, so a verdict does not depend on machine load.
    """
    _check_clock(clock)
    errors: dict[str, BaseException] = {}
    live: list[str] = []
    for name, run in runs.items():
        try:
            run()
        except Exception as error:
            errors[name] = error
        else:
            live.append(name)
    best: dict[str, float] = {}
    started = clock()
    for _ in range(repeats):
        if best and clock() - started > budget:
            break
        for name in live:
            start = clock()
            runs[name]()
            best[name] = min(best.get(name, math.inf), clock() - start)
        fastest = min(best.values(), default=math.inf)
        live = [n for n in live if best[n] <= PRUNE * fastest]
    return dict(sorted(best.items(), key=lambda kv: kv[1])), errors


def _check_clock(clock: object) -> None:
    if not callable(clock):
        raise bad_argument("clock", clock, "a callable returning seconds, like time.perf_counter")


def decide(
    backend: members.Strategies | str,
    strategy: str,
    batch: int,
    chunk: int,
    key: tuple[Any, ...],
    make_runs: Callable[[dict[str, int | None], int | None], Mapping[str, Callable[[], object]]],
    *,
    extra: tuple[str, ...] = (),
    make_step_runs: Callable[[str, int | None], Mapping[str, Callable[[], object]]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Decision:
    """The strategy for one call: forced, cached under `key`, or measured now.

    From `PRELIMINARY_FROM` members the candidates are first timed on `PRELIMINARY`
    members, and those more than `PRUNE` times slower than the best there are dropped
    unmeasured at full size (one survivor is chosen without more timing).

    Args:
        backend: the adapter's `Strategies` (or a backend's name, for those it declared).
        strategy: what the user asked for: ``"auto"`` or a strategy name.
        batch: the member count.
        chunk: the most members one vmapped call may hold (the budget's `chunk_size`).
        key: the cache key: backend, architecture, input shapes and dtypes, device, mode.
        make_runs: ``make_runs(options, members)`` builds one timed callable per candidate
            ``{strategy: chunk}``, running the first `members` members (None: all).
        extra: strategies this model allows beyond the backend's general ones (see
            `candidates`).
        make_step_runs: ``make_step_runs(strategy, chunk)`` builds ``{"batched": ...,
            "separate": ...}`` and optionally ``"optimizer"``: one whole training step of
            every member under the chosen strategy, one member's step alone, and the
            members' optimizer step alone; timed after the choice, so `explain` can say
            whether separate trainings would be faster (None or ``{}``: skipped). With
            "optimizer", the batched step is the chosen strategy's measured forward and
            backward plus the optimizer's step (the whole step is not run again).
        clock: what `measure` times both rounds with (`time.perf_counter` by default).

    Raises:
        ArgumentError: `clock` is not callable.
        Exception: the first candidate's own error, when every candidate failed.
    """
    _check_clock(clock)
    if strategy != "auto":
        return Decision(*plan(backend, strategy, batch, chunk), reason="forced")
    cached = CACHE.get(key)
    # A strategy only some models allow is taken from the cache only where this call
    # allows it (torch's "stacked" after its check against vmap in this process).
    if cached is not None and (cached.strategy not in OPTIONAL or cached.strategy in extra):
        return dataclasses.replace(cached, reason="cached")
    options = candidates(backend, batch, chunk, extra)
    dropped: dict[str, float] = {}
    errors: dict[str, BaseException] = {}
    if batch >= PRELIMINARY_FROM and len(options) > 1:
        small, errors = measure(make_runs(options, PRELIMINARY), clock=clock)
        if small:
            fastest = min(small.values())
            dropped = {k: v for k, v in small.items() if v > PRUNE * fastest}
            options = {k: v for k, v in options.items() if k in small and k not in dropped}
    if len(options) == 1 and (dropped or errors):
        timings: dict[str, float] = {}
    else:
        # Two rounds after the warm call: a third changed the choice only between
        # strategies within a few percent of each other, and cost 10% more of a short job.
        timings, more = measure(make_runs(options, None), repeats=FULL_ROUNDS, clock=clock)
        errors |= more
        if not timings:
            raise next(iter(errors.values()))
    best = next(iter(timings), next(iter(options)))
    text = {k: f"{type(e).__name__}: {e}".splitlines()[0][:200] for k, e in errors.items()}
    step = separate = None
    runs = dict(make_step_runs(best, options[best])) if make_step_runs is not None else {}
    if best in timings and "optimizer" in runs:
        runs.pop("batched", None)  # its forward and backward were just timed
    else:
        runs.pop("optimizer", None)
    if runs:
        whole, failed = measure(runs, repeats=2, clock=clock)
        if "batched" not in whole and "optimizer" in whole and best in timings:
            whole["batched"] = timings[best] + whole["optimizer"]
        if "batched" in whole and "separate" in whole:
            step, separate = whole["batched"], whole["separate"] * batch
        text |= {
            f"{k} step": f"{type(e).__name__}: {e}".splitlines()[0][:200] for k, e in failed.items()
        }
    decision = Decision(
        best, options[best], "measured", timings, text, dropped, step=step, separate=separate
    )
    CACHE.put(key, decision)
    return decision


def explain_text(
    decision: Decision | None, backend: str, batch: int, isolation: str | None = None
) -> str:
    """The report `BatchModule.explain()` returns: choice, reason, timings, probe."""
    lines = [f"BatchModule ({backend}, {batch} members)"]
    if decision is None:
        lines.append("  strategy: not chosen yet; the first call chooses it")
    else:
        size = f", chunks of {decision.chunk}" if decision.chunk else ""
        lines.append(f"  strategy: {decision.strategy}{size} ({decision.reason})")
        for name, seconds in decision.timings.items():
            mark = "  <- chosen" if name == decision.strategy else ""
            lines.append(f"    {name:<8} {seconds * 1e3:10.3f} ms per call{mark}")
        for name, seconds in decision.preliminary.items():
            lines.append(
                f"    {name:<8} {seconds * 1e3:10.3f} ms per call on {PRELIMINARY} members: "
                f"over {PRUNE:g}x the best there, not timed on all"
            )
        for name, error in decision.errors.items():
            lines.append(f"    {name:<8} failed: {error}")
        lines += _step_lines(decision, batch)
        lines += [f"    {note}" for note in decision.notes]
    lines.append(f"  isolation probe: {isolation or 'not run yet (runs on the first call)'}")
    return "\n".join(lines)


def _step_lines(decision: Decision, batch: int) -> list[str]:
    """What a whole training step costs batched, and as separate trainings."""
    if decision.step is None or decision.separate is None:
        return []
    step, separate = decision.step, decision.separate
    lines = [
        f"  whole step (forward, backward, Adam): {step * 1e3:.3f} ms batched; "
        f"{batch} separate trainings {separate * 1e3:.3f} ms "
        f"(one member alone {separate / batch * 1e3:.3f} ms x {batch})"
    ]
    if separate < step:
        lines.append(
            f"  separate trainings are faster here ({step / separate:.2f}x): this model does "
            "not batch well on this device (docs/batching.md, 'Which models batch well')"
        )
    else:
        lines.append(f"  batched is {separate / step:.2f}x faster than separate trainings")
    return lines
