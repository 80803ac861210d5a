"""Model batching under torch: N models of one architecture trained as one module.

`BatchModule` stacks the members' parameters into ``[batch, ...]`` leaf parameters and runs
one template module over them with ``torch.func`` (docs/batching.md). It holds the neutral
skeleton (settings, member checks, decisions, explain) as a `MemberBatch` and supplies its
torch hooks (`_Members`); the execution strategies and the probe are in `batching.run`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.utils import _pytree as pytree

from dualtrain.accelerate.decisions import code_digest
from dualtrain.batching import dispatch, isolation, members
from dualtrain.batching.skeleton import (
    BatchSettings,
    Framework,
    MemberBatch,
    MemberBatchModule,
    Setting,
)
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_torch.batching import probe as batching_probe, run as batching_run
from dualtrain_torch.batching.loss import batch_loss, batch_topk
from dualtrain_torch.batching.members import (
    Stack,
    copy_module,
    draw_members,
    entries_of,
    kind_of,
    non_persistent,
)

__all__ = ["BatchModule", "batch_loss", "batch_topk"]

FRAMEWORK = Framework("torch", "a non-empty list of nn.Modules", nn.Module, "an nn.Module")


class BatchModule(nn.Module, MemberBatchModule):
    """`batch` models of one architecture, run as one module (``torch.func`` underneath).

    Parameters are ``[batch, ...]`` leaf `nn.Parameter` s of this module, so any
    ``torch.optim`` optimizer over ``bm.parameters()`` steps every member; buffers (BatchNorm
    running statistics) are stacked too and updated per member in training. Inputs are
    ``[batch, B, ...]`` (or ``[B, ...]`` for every member with ``shared_input=True``);
    outputs are ``[batch, B, ...]``. Dropout draws differ per member.

    Args:
        module: any ``nn.Module``, a realized Craft included: the architecture, and the
            weights for ``init="identical"``. It is copied, never changed.
        batch: the member count, a positive int.
        init: ``"independent"``: member i holds what the module's own initializer draws
            for seed ``member_seeds(seed, batch)[i]`` (for a realized Craft exactly
            ``realize(craft, seed=...)``); ``"identical"``: every member is a copy of
            `module`.
        seed: an int in [0, 2**64), or one seed per member.
        shared_input: every member reads the same ``[B, ...]`` inputs.
        strategy: ``"auto"`` (measure on the first call, keep the fastest), ``"vmap"``,
            ``"chunked"``, ``"loop"`` or ``"stacked"`` (an ``nn.Sequential`` of Linear,
            Conv, pooling, Flatten, Dropout and activation layers: each layer runs once
            over all members, as batched by hand; checked against vmap on first use).
        memory_budget: bytes one vmapped call may take; members are split into chunks that
            fit (estimated from one member's call).
        check_isolation: probe, on the first call of each strategy and mode, that no
            member moves another.

    Raises:
        ArgumentError: a bad argument (the message names it, the value and what is
            expected), or ``init="independent"`` for a module that holds parameters without
            ``reset_parameters``.
    """

    _framework = FRAMEWORK
    _template: nn.Module  # set with object.__setattr__: not a submodule
    _core: MemberBatch[_Members]  # the neutral skeleton, with this module's torch hooks
    # Lay parameters out like their gradients on the first backward (match_gradient_layout:
    # vmap's Linear weight gradients come out transposed per member, and a contiguous
    # parameter pays a strided copy of each every step). False keeps them contiguous, for
    # code that flattens parameters or gradients with .view(-1) (LBFGS,
    # parameters_to_vector). state_dict() gives contiguous tensors either way.
    match_gradient_layout: bool = True

    def __init__(
        self,
        module: nn.Module,
        batch: int,
        *,
        init: str = "independent",
        seed: int | Sequence[int] = 0,
        shared_input: bool = False,
        strategy: str = "auto",
        memory_budget: int | None = None,
        check_isolation: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise bad_argument("module", module, "a torch nn.Module (a realized Craft too)")
        settings = FRAMEWORK.settings(
            batch,
            init=init,
            seed=seed,
            shared_input=shared_input,
            strategy=strategy,
            memory_budget=memory_budget,
            check_isolation=check_isolation,
        )
        entries = entries_of(module)
        if not any(trainable for *_, trainable in entries):
            raise bad_argument("module", module, "a module that holds at least one parameter")
        template = copy_module(module)
        # Not a submodule: its tensors are stand-ins that functional_call replaces.
        object.__setattr__(self, "_template", template)
        self.stack = Stack()
        hooks = _Members(settings, template, self.stack, entries, kind_of(module), module)
        self._core = MemberBatch(FRAMEWORK, settings, hooks, hooks.kind)
        if settings.strategy == "stacked" and hooks.stacked is None:
            raise bad_argument(
                "strategy",
                strategy,
                '"stacked" only for an nn.Sequential of Linear, Conv1d/2d, pooling, '
                'Flatten, Dropout and activation layers without hooks; use "auto" or "vmap"',
            )
        sources = dict(template.named_parameters()) | dict(template.named_buffers())
        skipped = non_persistent(template)
        for name, *_, trainable in entries:
            value = sources[name].detach()
            self.stack.put(
                name,
                value.unsqueeze(0).repeat_interleave(settings.batch, 0),
                trainable,
                requires_grad=sources[name].requires_grad,  # frozen members stay frozen
                persistent=name not in skipped,
            )
        if settings.init == "independent":
            params, buffers = self._tensors()
            draw_members(template, params | buffers, settings.seeds)
        # nn.Module.train leaves the template alone: it keeps each submodule's own mode (a
        # BatchNorm held in eval inside a training model stays so), as the member had it.
        super().train(module.training)
        self._register_state_dict_hook(_contiguous_state)

    # -- settings (the skeleton's) -----------------------------------------------------------

    shared_input = Setting[bool](writable=True)
    strategy = Setting[str](writable=True)
    memory_budget = Setting[int | None](writable=True)
    check_isolation = Setting[bool](writable=True)

    @property
    def _decision(self) -> dispatch.Decision | None:
        """The decision in use (None before the first call)."""
        return self._core.decision

    # -- members -------------------------------------------------------------------------

    def _tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The stacked parameters and buffers by member name, read live from their holders.

        The holders and names are found once (walking ``named_parameters`` costs more
        than a small model's forward); each call reads the holders' dicts, so a tensor
        replaced by ``.to()`` or by assignment is the one returned.
        """
        slots = self.__dict__.get("_slots")
        if slots is None:
            slots = self.__dict__["_slots"] = _slots(self.stack)
        params: dict[str, torch.Tensor] = {}
        buffers: dict[str, torch.Tensor] = {}
        for name, path, last, parameter in slots:
            holder: nn.Module = self.stack  # followed by name each call: a holder may be replaced
            for part in path:
                holder = holder._modules[part]  # type: ignore[assignment]
            if parameter:
                params[name] = cast(torch.Tensor, holder._parameters[last])
            else:
                buffers[name] = cast(torch.Tensor, holder._buffers[last])
        return params, buffers

    def extract(self, index: int) -> nn.Module:
        """Member `index` as an ordinary module (a copy of the template with its tensors)."""
        i = self._core.index(index)
        out = copy_module(self._template)
        params, buffers = self._tensors()
        with torch.no_grad():
            for name, t in (dict(out.named_parameters()) | dict(out.named_buffers())).items():
                t.copy_((params | buffers)[name][i])
        return out.train(self.training)

    def insert(self, index: int, module: nn.Module) -> None:
        """Makes member `index` a copy of `module` (same architecture), in place.

        Optimizer state for the member (momentum, Adam's moments) is left as it was.
        """
        self._write(*self._core.member(index, module))

    def _write(self, i: int, module: nn.Module) -> None:
        params, buffers = self._tensors()
        targets = params | buffers
        with torch.no_grad():
            for name, t in (dict(module.named_parameters()) | dict(module.named_buffers())).items():
                targets[name][i].copy_(t)

    # -- running ---------------------------------------------------------------------------

    def train(self, mode: bool = True) -> BatchModule:
        super().train(mode)
        self._template.train(mode)
        return self

    def _apply(self, fn: Any, recurse: bool = True) -> BatchModule:
        super()._apply(fn, recurse)
        self._template._apply(fn, recurse)  # extract() copies the template: same dtype, device
        self._core.hooks.refresh()
        return self

    def _call(
        self,
        inputs: Sequence[Any],
        tensors: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None,
    ) -> _Call:
        params, buffers = self._tensors() if tensors is None else tensors
        return _Call(params, buffers, inputs, self.training, self.match_gradient_layout)

    def _key(self, params: dict[str, torch.Tensor], inputs: Sequence[Any]) -> tuple[Any, ...]:
        """The decision key of a call with these parameters and inputs, in this mode."""
        return self._core.hooks.key(_Call(params, {}, inputs, self.training, False))

    def tune(self, *inputs: Any) -> str:
        """Chooses the strategy (and probes isolation) for these inputs now.

        The first call does the same by itself. Returns `explain`.
        """
        self._core.check_inputs(inputs)
        return self._core.tune(self._call(inputs), self.training)

    def forward(self, *inputs: Any) -> Any:
        """The members' outputs ``[batch, B, ...]`` for inputs ``[batch, B, ...]``."""
        self._core.check_inputs(inputs)
        params, buffers = tensors = self._tensors()
        decision = self._core.decide(self._call(inputs, tensors), self.training)
        return batching_run.run_members(
            self._template,
            decision.strategy,
            decision.chunk,
            params,
            buffers,
            inputs,
            self.shared_input,
        )

    def extra_repr(self) -> str:
        return self._core.summary()


class _Call:
    """One call as the hooks see it: the stacked tensors, the inputs, the mode."""

    __slots__ = ("buffers", "inputs", "layout", "params", "training")

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        inputs: Sequence[Any],
        training: bool,
        layout: bool,
    ) -> None:
        self.params, self.buffers, self.inputs = params, buffers, inputs
        self.training, self.layout = training, layout  # layout: match_gradient_layout


class _Members:
    """The torch hooks of a BatchModule's skeleton (`FrameworkHooks`).

    The template, its architecture and the stacked tensors' holder; how a member is
    checked and a call keyed, chosen, probed and laid out.
    """

    def __init__(
        self,
        settings: BatchSettings,
        template: nn.Module,
        stack: Stack,
        entries: list[members.Entry],
        kind: str,
        module: nn.Module,
    ) -> None:
        self.settings, self.template, self.stack = settings, template, stack
        self.entries, self.kind = entries, kind
        self.arch = members.architecture_key(kind, entries)  # built once, keyed often
        # The decision is cached on disk: a model whose code changed is another key (a
        # strategy measured for the old forward may not run the new one).
        self.code = code_digest(tuple(dict.fromkeys(type(m).forward for m in module.modules())))
        # The "stacked" strategy's plan (None: the model has a piece it cannot run), and
        # its check against vmap by key (None: agreed; else what differed).
        self.stacked = batching_run.stacked_plan(template)
        self.stacked_checks: dict[tuple[Any, ...], str | None] = {}
        self.laid_out = False  # parameters laid out like their gradients (first backward)

    def refresh(self) -> None:
        """After ``.to()``: the members as they are now (``.double()`` changes dtypes)."""
        self.laid_out = False  # .to() may lay parameters out afresh
        self.entries = entries_of(self.template)
        self.arch = members.architecture_key(self.kind, self.entries)

    # -- members ---------------------------------------------------------------------------

    def values(self, module: Any, name: str) -> Any:
        """Refuses a member that would not run as the first one does; returns it.

        Every member runs through the template's code, settings and hooks with one
        ``requires_grad`` per stacked parameter, so all of these must be the first
        member's: the message names the member, the tensor or submodule, and both values.
        """
        if not isinstance(module, nn.Module):
            raise bad_argument(name, module, "an nn.Module")
        kind = kind_of(module)
        differs = f"it is a {kind}, the first member a {self.kind}" if kind != self.kind else ""
        members.compare_architectures(self.entries, entries_of(module), name, differs)
        stacked = dict(self.stack.named_parameters())  # as they are now (a member frozen since)
        for key, p in module.named_parameters():
            ours = stacked[key].requires_grad
            theirs = p.requires_grad and p.is_floating_point()
            if ours != theirs:
                raise members.refuse_member(
                    name,
                    f"{key} has requires_grad={theirs} there but {ours} in the batch: one "
                    "stacked parameter trains every member or none (freeze it in every "
                    "member, or in none)",
                )
        if non_persistent(module) != non_persistent(self.template):
            raise members.refuse_member(
                name,
                f"its non-persistent buffers are {sorted(non_persistent(module))} there but "
                f"{sorted(non_persistent(self.template))} in the first member",
            )
        _check_submodules(self.template, module, name)
        return module

    def modes(self, module: Any) -> Mapping[str, bool]:
        return {sub or "the module": m.training for sub, m in module.named_modules()}

    def arrays(self, value: Any) -> Iterable[tuple[str, Sequence[int]]]:
        if isinstance(value, torch.Tensor):  # the common case, without a tree walk
            return (("", value.shape),)
        return [
            (pytree.keystr(path), leaf.shape)
            for path, leaf in pytree.tree_flatten_with_path(value)[0]
            if isinstance(leaf, torch.Tensor)
        ]

    # -- decisions -------------------------------------------------------------------------

    def key(self, call: Any) -> tuple[Any, ...]:
        inputs = call.inputs
        shapes: tuple[Any, ...]
        if all(type(x) is torch.Tensor for x in inputs):  # the common case: no tree walk
            shapes = ("tensors", *((tuple(x.shape), str(x.dtype)) for x in inputs))
        else:
            leaves, spec = pytree.tree_flatten(list(inputs))
            shapes = (
                str(spec),
                *(
                    (tuple(x.shape), str(x.dtype))
                    if isinstance(x, torch.Tensor)
                    else type(x).__name__
                    for x in leaves
                ),
            )
        s = self.settings
        return (
            "torch",
            torch.__version__,  # the disk cache outlives an upgrade
            self.arch,
            self.code,
            shapes,
            str(next(iter(call.params.values())).device),
            (call.training, torch.is_grad_enabled()),
            s.batch,
            s.shared_input,
            s.memory_budget,
        )

    def choose(self, key: tuple[Any, ...], call: Any) -> dispatch.Decision:
        s, template = self.settings, self.template
        params, buffers, inputs = call.params, call.buffers, call.inputs
        chunk = s.batch
        if s.memory_budget is not None:
            need = batching_run.member_bytes(template, params, buffers, inputs, s.shared_input)
            chunk = dispatch.chunk_size(s.batch, need, s.memory_budget)
        extra, refused = self._stacked_allowed(key, call)
        decision = dispatch.decide(
            "torch",
            s.strategy,
            s.batch,
            chunk,
            key,
            lambda options, members: batching_run.timed_runs(
                template, options, params, buffers, inputs, s.shared_input, members
            ),
            extra=extra,
            make_step_runs=lambda strategy, chunk: batching_run.step_runs(
                batching_run.Run(template, strategy, chunk, params, buffers, inputs, s.shared_input)
            ),
        )
        if refused and decision.reason == "measured":
            decision = dataclasses.replace(decision, errors={**decision.errors, **refused})
        return decision

    def adopt(self, decision: dispatch.Decision, call: Any, probe: bool) -> str | None:
        run = batching_run.Run(
            self.template,
            decision.strategy,
            decision.chunk,
            call.params,
            call.buffers,
            call.inputs,
            self.settings.shared_input,
        )
        verdict = None
        if probe:
            verdict = isolation.run_probe(
                lambda: batching_probe.probe(run),
                decision.strategy,
                ran=decision.reason == "measured",
            )
        if not self.laid_out and call.layout and torch.is_grad_enabled():
            batching_run.match_gradient_layout(run)
            self.laid_out = True
        return verdict

    def _stacked_allowed(
        self, key: tuple[Any, ...], call: _Call
    ) -> tuple[tuple[str, ...], dict[str, str]]:
        """Whether "stacked" may run these inputs: planned, and equal to vmap on them.

        Checked once per key and BatchModule, in every process (a decision from the disk
        cache is never trusted for correctness). Returns ``(extra, refused)``: the
        strategies to offer beyond the general ones, and why "stacked" was refused.

        Raises:
            ArgumentError: ``strategy="stacked"`` and it differs from vmap here.
        """
        strategy = self.settings.strategy
        if strategy not in ("auto", "stacked") or self.stacked is None:
            return (), {}
        if key not in self.stacked_checks:
            self.stacked_checks[key] = batching_run.check_stacked(
                self.template, call.params, call.buffers, call.inputs, self.settings.shared_input
            )
        found = self.stacked_checks[key]
        if found is None:
            return ("stacked",), {}
        if strategy == "stacked":
            raise ArgumentError(f'strategy="stacked" does not compute what vmap does here: {found}')
        return (), {"stacked": f"refused: {found}"}


_HOOKS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
)


def _slots(stack: nn.Module) -> list[tuple[str, tuple[str, ...], str, bool]]:
    """(member name, path to its holder, attribute, is a parameter) of each stacked tensor."""
    out: list[tuple[str, tuple[str, ...], str, bool]] = []
    for prefix, holder in stack.named_modules():
        head = f"{prefix}." if prefix else ""
        path = tuple(prefix.split(".")) if prefix else ()
        out += [(head + k, path, k, True) for k, v in holder._parameters.items() if v is not None]
        out += [(head + k, path, k, False) for k, v in holder._buffers.items() if v is not None]
    # named_parameters' order: every parameter, then every buffer
    return [s for s in out if s[3]] + [s for s in out if not s[3]]


def _check_submodules(first: nn.Module, module: nn.Module, name: str) -> None:
    """The same submodules, classes, settings and hooks as `first` (the template)."""
    ours, theirs = dict(first.named_modules()), dict(module.named_modules())
    if list(ours) != list(theirs):
        raise members.refuse_member(
            name, f"its submodules are {list(theirs)} there but {list(ours)} in the first member"
        )
    names = {id(m): sub for sub, m in theirs.items()} | {id(m): sub for sub, m in ours.items()}
    for sub, m in theirs.items():
        where = sub or "the module"
        ref = ours[sub]
        if _class_of(m) != _class_of(ref):
            raise members.refuse_member(
                name,
                f"{where} is a {_class_name(m)} there but a {_class_name(ref)} in the first member",
            )
        settings, reference = _settings(m), _settings(ref)
        for key in dict.fromkeys([*reference, *settings]):
            path = f"{sub}.{key}" if sub else key
            found = members.config_difference(
                reference.get(key, members.ABSENT), settings.get(key, members.ABSENT), path
            )
            if found is not None:
                raise members.refuse_member(name, found)
        for hooks in _HOOKS:
            got = [_hook_key(h, names) for h in getattr(m, hooks, {}).values()]
            want = [_hook_key(h, names) for h in getattr(ref, hooks, {}).values()]
            kind = hooks.strip("_").replace("_", " ")
            if len(got) != len(want):
                raise members.refuse_member(
                    name,
                    f"{where} has {len(got)} {kind} there but {len(want)} in the first "
                    "member: the batch runs the first member's hooks for every member",
                )
            for i, (ours_, theirs_) in enumerate(zip(want, got, strict=True)):
                # Hooks built separately in each member (a closure, a WeightNorm object)
                # are the same hook when their code and settings are.
                found = members.config_difference(ours_, theirs_, f"{where}'s {kind}[{i}]")
                if found is not None:
                    raise members.refuse_member(
                        name, f"{found}: the batch runs the first member's hooks for every member"
                    )


def _class_of(module: nn.Module) -> type:
    """A module's class, parametrized ones as their original class.

    ``torch.nn.utils.parametrize`` gives each module its own generated subclass; its
    parametrizations are submodules (``parametrizations.weight.0``), compared as such.
    """
    cls = type(module)
    return cls.__bases__[0] if parametrize.is_parametrized(module) else cls


def _class_name(module: nn.Module) -> str:
    cls = type(module)
    if parametrize.is_parametrized(module):
        return f"{cls.__qualname__} (a parametrized {_class_of(module).__qualname__})"
    return cls.__qualname__


def _hook_key(hook: Any, names: dict[int, str]) -> Any:
    """A hook as compared across members: a method of the member's own submodule by name.

    The template is a deep copy of the first member, so its method hooks are bound to the
    copy; the same method of the same submodule is the same hook in every member.
    """
    if type(hook).__name__ == "_WrappedHook":  # torch's module-passing wrapper
        # Its copied attributes (``__wrapped__``, a hook object's settings) do not survive
        # the template's deep copy: compare what it wraps and the submodule it passes.
        module = hook.module() if hook.with_module else None
        return ("wrapped", _hook_key(hook.hook, names), names.get(id(module)))
    owner = getattr(hook, "__self__", None)
    if owner is not None and id(owner) in names:
        return ("method", getattr(hook, "__func__", hook), names[id(owner)])
    return hook


def _settings(module: nn.Module) -> dict[str, Any]:
    """A module's public attributes (its hyperparameters); tensors and submodules aside."""
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and k != "training"}


def _contiguous_state(module: nn.Module, state: dict[str, Any], prefix: str, local: Any) -> None:
    """state_dict() values are contiguous (safetensors refuses strided tensors)."""
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and not value.is_contiguous():
            state[name] = value.contiguous()
