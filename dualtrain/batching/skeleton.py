"""The skeleton both BatchModules share, as one object each holds: `MemberBatch`.

A BatchModule runs N members of one architecture as one. What does not depend on the
framework lives here: the settings (member count, seeds, shared input, strategy, budget),
the member index checks of `extract` and `insert`, the member loop of ``from_modules``,
the decision for each call signature (looked up, else chosen, probed once per strategy and
mode, then kept), ``tune``'s and ``explain``'s text, the repr. What does depend on it each
adapter supplies as `FrameworkHooks` (its member checks, an input's arrays, a call's key,
the choice, the probe) and declares as data in a `Framework`.

torch's BatchModule keeps its `MemberBatch` as an attribute; JAX's in the pytree's static
aux data (compared by identity, so ``jit`` retraces per BatchModule, as before). Both
subclass `MemberBatchModule`, which reads their `MemberBatch` for what they share
(``from_modules``, ``explain``, the settings they expose) and asks each for its one hook,
``_write``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import (
    Any,
    ClassVar,
    Generic,
    Protocol,
    Self,
    TypeVar,
    cast,
    overload,
    runtime_checkable,
)

from dualtrain.batching import dispatch, members
from dualtrain.batching.dispatch import Decision
from dualtrain.errors import ArgumentError, bad_argument

__all__ = [
    "ANY",
    "BatchSettings",
    "Framework",
    "FrameworkHooks",
    "MemberBatch",
    "MemberBatchModule",
    "Setting",
]


class _Wildcard(enum.Enum):  # an enum: it pickles as itself, so a kept key still matches
    ANY = "any"

    def __repr__(self) -> str:
        return "ANY"


# A field of a call's key that cannot be known yet (JAX's device under a trace): the key
# matches a kept decision whose other fields are equal, whatever that field holds there.
ANY = _Wildcard.ANY


@runtime_checkable
class FrameworkHooks(Protocol):
    """What a `MemberBatch` asks of its framework; each adapter implements it once.

    `call` is the adapter's own record of one call (its tensors, inputs, mode): the
    skeleton only hands it back.
    """

    def values(self, module: Any, name: str) -> Any:
        """What `insert` copies from `module`; refuses one unlike the first member.

        Raises:
            ArgumentError: naming the member `name` (``"modules[2]"``) and what differs.
        """
        ...

    def modes(self, module: Any) -> Mapping[str, bool]:
        """Whether each part of `module` trains, by where (``"the module"``, ``"fc"``)."""
        ...

    def arrays(self, value: Any) -> Iterable[tuple[str, Sequence[int]]]:
        """The arrays of one input that carry the member dimension: (key path, shape)."""
        ...

    def key(self, call: Any) -> tuple[Any, ...]:
        """The decision key of `call`: its inputs' shapes and dtypes, device, mode, ...

        A field unknown for this call is `ANY`.
        """
        ...

    def choose(self, key: tuple[Any, ...], call: Any) -> Decision:
        """A decision for a key not seen before: forced, cached or timed.

        One whose reason is ``"default"`` (not measured: under a trace) runs this call only.
        """
        ...

    def adopt(self, decision: Decision, call: Any, probe: bool) -> str | None:
        """Readies a new decision; probes isolation when `probe`.

        Returns the probe's verdict, or None when it was not run (not asked, or it cannot
        run in this call).
        """
        ...


H = TypeVar("H", bound=FrameworkHooks)


@dataclasses.dataclass
class BatchSettings:
    """A BatchModule's arguments, checked (see either adapter's ``BatchModule``).

    Attributes:
        batch: the member count (>= 1).
        init: ``"independent"`` or ``"identical"``.
        seeds: each member's realize seed (`members.member_seeds`).
        shared_input: every member reads the same ``[B, ...]`` inputs.
        strategy: ``"auto"`` or one of the backend's strategies.
        memory_budget: bytes one vmapped call may take; None: no limit.
        check_isolation: probe, once per strategy and mode, that no member moves another.
    """

    batch: int
    init: str
    seeds: list[int]
    shared_input: bool
    strategy: str
    memory_budget: int | None
    check_isolation: bool


T = TypeVar("T")


def _module_settings(module: Any) -> BatchSettings:
    """A BatchModule's settings: its skeleton's (``_core.settings``)."""
    return cast(BatchSettings, module._core.settings)


def _own_settings(core: Any) -> BatchSettings:
    """A `MemberBatch`'s settings: its own."""
    return cast(BatchSettings, core.settings)


class Setting(Generic[T]):
    """An attribute that is the `BatchSettings` field of the same name.

    The value lives once, in the skeleton's settings, which `of` finds from the object
    (default: a BatchModule's, ``_core.settings``); `writable` lets a user assign it there
    (else assigning raises AttributeError, as a property without a setter does).
    """

    def __init__(
        self,
        writable: bool = False,
        *,
        of: Callable[[Any], BatchSettings] = _module_settings,
        doc: str | None = None,
    ) -> None:
        self.writable, self.of = writable, of
        self.name = ""
        if doc is not None:
            self.__doc__ = doc  # what help() shows for the attribute (else the class's)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, module: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, module: object, owner: type | None = None) -> T: ...

    def __get__(self, module: object, owner: type | None = None) -> Any:
        if module is None:
            return self
        return getattr(self.of(module), self.name)

    def __set__(self, module: object, value: T) -> None:
        if not self.writable:
            raise AttributeError(
                f"property {self.name!r} of {type(module).__name__!r} object has no setter"
            )
        setattr(self.of(module), self.name, value)


@dataclasses.dataclass(frozen=True)
class Framework:
    """What an adapter declares about its BatchModule: framework policy as data.

    Attributes:
        backend: ``"torch"`` or ``"jax"``: which strategies it offers, what `explain` says.
        modules: what ``from_modules`` takes, for its error (``"a non-empty list of ..."``).
        member: the class every listed member must be before anything is built (None: the
            `FrameworkHooks.values` check alone); a list that is one is refused too.
        member_text: that class as the error says it (``"an nn.Module"``).
    """

    backend: str
    modules: str
    member: type | None = None
    member_text: str = ""

    def settings(
        self,
        batch: object,
        *,
        init: object,
        seed: object,
        shared_input: object,
        strategy: object,
        memory_budget: object,
        check_isolation: object,
    ) -> BatchSettings:
        """The arguments checked in the order both adapters document.

        Raises:
            ArgumentError: the first bad argument, named with its value.
        """
        count = members.check_batch(batch)
        return BatchSettings(
            batch=count,
            init=members.check_init(init),
            seeds=members.member_seeds(seed, count),
            shared_input=members.check_flag("shared_input", shared_input),
            strategy=members.check_strategy(strategy, self.backend),
            memory_budget=members.check_memory_budget(memory_budget),
            check_isolation=members.check_flag("check_isolation", check_isolation),
        )

    def module_list(self, modules: object) -> Sequence[Any]:
        """`modules` as ``from_modules`` takes them: a non-empty sequence of members.

        Raises:
            ArgumentError: naming ``modules`` or the first member of the wrong class.
        """
        kind = self.member
        if (
            not isinstance(modules, Sequence)
            or (kind is not None and isinstance(modules, kind))
            or not modules
        ):
            raise bad_argument("modules", modules, self.modules)
        if kind is not None:
            for i, m in enumerate(modules):
                if not isinstance(m, kind):
                    raise bad_argument(f"modules[{i}]", m, self.member_text)
        return modules


class MemberBatch(Generic[H]):
    """The framework-free half of a BatchModule: settings, members' bookkeeping, decisions.

    Args:
        framework: the adapter's declared policy.
        settings: the checked arguments (`Framework.settings`); shared with `hooks`.
        hooks: the adapter's `FrameworkHooks`.
        kind: the first member's class, as the repr names it.

    Attributes:
        decision: the decision in use (None: no call yet).
        isolation: the isolation probe's verdict for it (None: not run).
    """

    def __init__(self, framework: Framework, settings: BatchSettings, hooks: H, kind: str) -> None:
        self.framework, self.settings, self.hooks, self.kind = framework, settings, hooks, kind
        self.decision: Decision | None = None
        self.isolation: str | None = None
        self._decisions: dict[tuple[Any, ...], Decision] = {}
        self._probed: dict[tuple[str, bool], str] = {}  # by (strategy, training)

    batch = Setting[int](of=_own_settings)
    shared_input = Setting[bool](of=_own_settings)
    strategy = Setting[str](
        of=_own_settings,
        doc='The strategy asked for (``"auto"`` or a name); `decision` names the one in use.',
    )

    # -- members ---------------------------------------------------------------------------

    def index(self, index: object) -> int:
        """A member index in ``[-batch, batch)``, returned in ``[0, batch)``.

        Raises:
            ArgumentError: ``index must be an int in [-batch, batch - 1]``.
        """
        return members.check_member(index, self.batch)

    def member(self, index: object, module: Any) -> tuple[int, Any]:
        """What ``insert(index, module)`` writes: the row, and `module`'s values.

        Raises:
            ArgumentError: a bad index, or a module unlike the first member.
        """
        return self.index(index), self.hooks.values(module, "module")

    def admit(self, modules: Sequence[Any]) -> list[tuple[int, Any]]:
        """The rows and values of ``modules[1:]``, each checked against ``modules[0]``.

        Every member runs through the first one's code in one mode per part, so its
        architecture and each part's mode must be the first's; all are checked before any
        is written.

        Raises:
            ArgumentError: naming the first member that differs (``modules[i]``) and how.
        """
        first = self.hooks.modes(modules[0])
        out = []
        for i, m in enumerate(modules[1:], start=1):
            name = f"modules[{i}]"
            out.append((i, self.hooks.values(m, name)))
            for where, training in self.hooks.modes(m).items():
                ours = first.get(where, training)
                if training != ours:
                    raise members.refuse_member(
                        name,
                        f"{where} is in {_mode(training)} mode there but in {_mode(ours)} "
                        "mode in the first member",
                    )
        return out

    # -- calls -----------------------------------------------------------------------------

    def check_inputs(self, inputs: Sequence[Any]) -> None:
        """Refuses no input, or (unless shared) an array without the member count first.

        Raises:
            ArgumentError: no input.
            ShapeError: naming the input (``inputs[0]['x']``), the layout and its shape.
        """
        if not inputs:
            raise ArgumentError("BatchModule needs at least one input; got none")
        if self.shared_input:
            return
        for i, x in enumerate(inputs):
            for path, shape in self.hooks.arrays(x):
                members.check_leading(f"inputs[{i}]{path}", shape, self.batch, "[batch, B, ...]")

    def decide(self, call: Any, training: bool) -> Decision:
        """The decision for `call`: kept for its key, else chosen, probed once and kept.

        Isolation is probed once per strategy and mode: a module may mix members only in
        training (a batch statistic), or only under one strategy.
        """
        key = self.hooks.key(call)
        known = self._known(key)
        if known is not None:
            self.decision = known
            self.isolation = self._probed.get((known.strategy, training), self.isolation)
            return known
        decision = self.hooks.choose(key, call)
        if decision.reason == "default":  # not measured: runs this call, chosen again later
            return decision
        probed = (decision.strategy, training)
        verdict = self.hooks.adopt(
            decision, call, self.settings.check_isolation and probed not in self._probed
        )
        if verdict is not None:
            self._probed[probed] = verdict
        self.isolation = self._probed.get(probed)
        self._decisions[key] = decision
        self.decision = decision
        return decision

    def _known(self, key: tuple[Any, ...]) -> Decision | None:
        if ANY not in key:
            return self._decisions.get(key)
        for kept, decision in self._decisions.items():  # the first kept, as it was chosen
            if len(kept) == len(key) and all(
                k is ANY or k == v for k, v in zip(key, kept, strict=True)
            ):
                return decision
        return None

    def tune(self, call: Any, training: bool) -> str:
        """Decides for `call` now (as its first run would); returns `explain`."""
        self.decide(call, training)
        return self.explain()

    def explain(self) -> str:
        """The strategy in use, why, what was timed, and the isolation verdict.

        A decision with notes (JAX's rule or its timing lines) says it in them, in place
        of the timing table.
        """
        text = dispatch.explain_text(
            self.decision, self.framework.backend, self.batch, self.isolation
        )
        if self.decision is None or not self.decision.notes:
            return text
        lines = text.splitlines()
        keep = [lines[0], lines[1]]  # the header and the strategy line
        keep += ["    " + note for note in self.decision.notes]
        return "\n".join(keep + [line for line in lines if line.startswith("  isolation")])

    def summary(self) -> str:
        """``batch=..., module=..., strategy=...``: what a BatchModule's repr shows."""
        return f"batch={self.batch}, module={self.kind}, strategy={self.strategy!r}"

    def __repr__(self) -> str:
        return f"MemberBatch({self.framework.backend}, {self.summary()})"


class MemberBatchModule:
    """What both BatchModules share over their `MemberBatch`: a template method base.

    A subclass sets `_framework` (its declared `Framework`), keeps its skeleton as `_core`,
    takes the constructor arguments ``from_modules`` passes, and overrides `_write`. The
    settings both expose are read here; a subclass makes one writable, or exposes more,
    with its own `Setting`.
    """

    _framework: ClassVar[Framework]
    _core: MemberBatch[Any]

    batch = Setting[int]()
    init = Setting[str]()
    seeds = Setting[list[int]]()
    shared_input = Setting[bool]()
    strategy = Setting[str]()

    @classmethod
    def from_modules(
        cls,
        modules: Sequence[Any],
        *,
        shared_input: bool = False,
        strategy: str = "auto",
        memory_budget: int | None = None,
        check_isolation: bool = True,
    ) -> Self:
        """A BatchModule whose member i is ``modules[i]`` (its weights and buffers or state).

        The members are torch ``nn.Module`` s; under JAX, JaxModules of one Craft class, or
        ``(params, apply_fn)`` pairs with the same ``apply_fn``.

        Raises:
            ArgumentError: an empty list, a non-module, or members whose class, tensor
                names, shapes or dtypes differ (the message names the first difference).
        """
        modules = cls._framework.module_list(modules)
        out: Self = cast(Any, cls)(
            modules[0],
            len(modules),
            init="identical",
            shared_input=shared_input,
            strategy=strategy,
            memory_budget=memory_budget,
            check_isolation=check_isolation,
        )
        for i, values in out._core.admit(modules):
            out._write(i, values)
        return out

    def _write(self, i: int, values: Any) -> None:
        """Writes member `i`'s values (what `FrameworkHooks.values` returned for it)."""
        raise NotImplementedError

    def explain(self) -> str:
        """The strategy in use, why, what was timed (or why not), and the isolation verdict."""
        return self._core.explain()


def _mode(training: bool) -> str:
    return "training" if training else "eval"
