"""Model batching under torch: N models of one architecture trained as one module.

`BatchModule` stacks the members' parameters into ``[batch, ...]`` leaf parameters and runs
one template module over them with ``torch.func`` (docs/batching.md). The neutral parts
(argument checks, member seeds, strategy choice and its cache, the isolation verdict) live
in `dualtrain.batching`; the execution strategies and the probe in `batching_run`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.utils import _pytree as pytree

from dualtrain.accelerate.decisions import code_digest
from dualtrain.batching import dispatch, isolation, members
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_torch import batching_probe, batching_run
from dualtrain_torch.batching_loss import batch_loss, batch_topk
from dualtrain_torch.batching_members import (
    Stack,
    copy_module,
    draw_members,
    entries_of,
    kind_of,
    non_persistent,
)

__all__ = ["BatchModule", "batch_loss", "batch_topk"]


class BatchModule(nn.Module):
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

    _template: nn.Module  # set with object.__setattr__: not a submodule
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
        batch = members.check_batch(batch)
        init = members.check_init(init)
        seeds = members.member_seeds(seed, batch)
        self.shared_input = members.check_flag("shared_input", shared_input)
        self.strategy = members.check_strategy(strategy, "torch")
        self.memory_budget = members.check_memory_budget(memory_budget)
        self.check_isolation = members.check_flag("check_isolation", check_isolation)
        entries = entries_of(module)
        if not any(trainable for *_, trainable in entries):
            raise bad_argument("module", module, "a module that holds at least one parameter")
        self.batch, self.init, self.seeds = batch, init, seeds
        template = copy_module(module)
        # Not a submodule: its tensors are stand-ins that functional_call replaces.
        object.__setattr__(self, "_template", template)
        self._entries, self._kind = entries, kind_of(module)
        self._arch = members.architecture_key(self._kind, entries)  # built once, keyed often
        # The decision is cached on disk: a model whose code changed is another key (a
        # strategy measured for the old forward may not run the new one).
        self._code = code_digest(tuple(dict.fromkeys(type(m).forward for m in module.modules())))
        self._decisions: dict[tuple[Any, ...], dispatch.Decision] = {}
        # The "stacked" strategy's plan (None: the model has a piece it cannot run), and
        # its check against vmap by key (None: agreed; else what differed).
        self._stacked = batching_run.stacked_plan(template)
        self._stacked_checks: dict[tuple[Any, ...], str | None] = {}
        if self.strategy == "stacked" and self._stacked is None:
            raise bad_argument(
                "strategy",
                strategy,
                '"stacked" only for an nn.Sequential of Linear, Conv1d/2d, pooling, '
                'Flatten, Dropout and activation layers without hooks; use "auto" or "vmap"',
            )
        self._decision: dispatch.Decision | None = None
        self._isolation: str | None = None  # the probe's verdict for the decision in use
        self._probed: dict[tuple[str, bool], str] = {}  # by (strategy, training)
        self._laid_out = False  # parameters laid out like their gradients (first backward)
        self.stack = Stack()
        sources = dict(template.named_parameters()) | dict(template.named_buffers())
        skipped = non_persistent(template)
        for name, *_, trainable in entries:
            value = sources[name].detach()
            self.stack.put(
                name,
                value.unsqueeze(0).repeat_interleave(batch, 0),
                trainable,
                requires_grad=sources[name].requires_grad,  # frozen members stay frozen
                persistent=name not in skipped,
            )
        if init == "independent":
            params, buffers = self._tensors()
            draw_members(template, params | buffers, seeds)
        # nn.Module.train leaves the template alone: it keeps each submodule's own mode (a
        # BatchNorm held in eval inside a training model stays so), as the member had it.
        super().train(module.training)
        self._register_state_dict_hook(_contiguous_state)

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

    @classmethod
    def from_modules(
        cls,
        modules: Sequence[nn.Module],
        *,
        shared_input: bool = False,
        strategy: str = "auto",
        memory_budget: int | None = None,
        check_isolation: bool = True,
    ) -> BatchModule:
        """A BatchModule whose member i is ``modules[i]`` (its weights and buffers).

        Raises:
            ArgumentError: an empty list, a non-module, or modules whose class, tensor names,
                shapes or dtypes differ (the message names the first difference).
        """
        if not isinstance(modules, Sequence) or isinstance(modules, nn.Module) or not modules:
            raise bad_argument("modules", modules, "a non-empty list of nn.Modules")
        for i, m in enumerate(modules):
            if not isinstance(m, nn.Module):
                raise bad_argument(f"modules[{i}]", m, "an nn.Module")
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
            out._check_same(m, f"modules[{i}]")
            _check_modes(modules[0], m, f"modules[{i}]")
        for i, m in enumerate(modules[1:], start=1):
            out.insert(i, m)
        return out

    def _check_same(self, module: Any, name: str) -> None:
        """Refuses a member that would not run as the first one does.

        Every member runs through the template's code, settings and hooks with one
        ``requires_grad`` per stacked parameter, so all of these must be the first
        member's: the message names the member, the tensor or submodule, and both values.
        """
        if not isinstance(module, nn.Module):
            raise bad_argument(name, module, "an nn.Module")
        kind = kind_of(module)
        differs = f"it is a {kind}, the first member a {self._kind}" if kind != self._kind else ""
        members.compare_architectures(self._entries, entries_of(module), name, differs)
        stacked = dict(self.stack.named_parameters())
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
        if non_persistent(module) != non_persistent(self._template):
            raise members.refuse_member(
                name,
                f"its non-persistent buffers are {sorted(non_persistent(module))} there but "
                f"{sorted(non_persistent(self._template))} in the first member",
            )
        _check_submodules(self._template, module, name)

    def extract(self, index: int) -> nn.Module:
        """Member `index` as an ordinary module (a copy of the template with its tensors)."""
        i = members.check_member(index, self.batch)
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
        i = members.check_member(index, self.batch)
        self._check_same(module, "module")
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
        self._laid_out = False  # .to() may lay parameters out afresh
        self._template._apply(fn, recurse)  # extract() copies the template: same dtype, device
        # insert() compares against the members as they are now (.double() changes dtypes).
        self._entries = entries_of(self._template)
        self._arch = members.architecture_key(self._kind, self._entries)
        return self

    def _check_inputs(self, inputs: Sequence[Any]) -> None:
        if not inputs:
            raise ArgumentError("BatchModule needs at least one input; got none")
        if self.shared_input:
            return
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):  # the common case, without a tree walk
                members.check_leading(f"inputs[{i}]", x.shape, self.batch, "[batch, B, ...]")
                continue
            for path, leaf in pytree.tree_flatten_with_path(x)[0]:
                if isinstance(leaf, torch.Tensor):
                    name = f"inputs[{i}]{pytree.keystr(path)}"
                    members.check_leading(name, leaf.shape, self.batch, "[batch, B, ...]")

    def _key(self, params: dict[str, torch.Tensor], inputs: Sequence[Any]) -> tuple[Any, ...]:
        shapes: tuple[Any, ...]
        if all(type(x) is torch.Tensor for x in inputs):  # the common case: no tree walk
            shapes = ("tensors", *((tuple(x.shape), str(x.dtype)) for x in inputs))
            return self._key_of(params, shapes)
        leaves, spec = pytree.tree_flatten(list(inputs))
        shapes = (
            str(spec),
            *(
                (tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else type(x).__name__
                for x in leaves
            ),
        )
        return self._key_of(params, shapes)

    def _key_of(self, params: dict[str, torch.Tensor], shapes: tuple[Any, ...]) -> tuple[Any, ...]:
        device = str(next(iter(params.values())).device)
        mode = (self.training, torch.is_grad_enabled())
        return (
            "torch",
            torch.__version__,  # the disk cache outlives an upgrade
            self._arch,
            self._code,
            shapes,
            device,
            mode,
            self.batch,
            self.shared_input,
            self.memory_budget,
        )

    def _decide(
        self,
        inputs: Sequence[Any],
        tensors: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None,
    ) -> dispatch.Decision:
        params, buffers = self._tensors() if tensors is None else tensors
        key = self._key(params, inputs)
        known = self._decisions.get(key)
        if known is not None:
            self._decision = known
            self._isolation = self._probed.get((known.strategy, self.training), self._isolation)
            return known
        chunk = self.batch
        if self.memory_budget is not None:
            need = batching_run.member_bytes(
                self._template, params, buffers, inputs, self.shared_input
            )
            chunk = dispatch.chunk_size(self.batch, need, self.memory_budget)
        extra, refused = self._stacked_allowed(key, params, buffers, inputs)
        decision = dispatch.decide(
            "torch",
            self.strategy,
            self.batch,
            chunk,
            key,
            lambda options, members: batching_run.timed_runs(
                self._template, options, params, buffers, inputs, self.shared_input, members
            ),
            extra=extra,
            make_step_runs=lambda strategy, chunk: batching_run.step_runs(
                self._template, strategy, chunk, params, buffers, inputs, self.shared_input
            ),
        )
        if refused and decision.reason == "measured":
            decision = dataclasses.replace(decision, errors={**decision.errors, **refused})
        probe_key = (decision.strategy, self.training)
        if self.check_isolation and probe_key not in self._probed:
            # Once per strategy and mode: a module may mix members only in training
            # (a batch statistic), or only under one strategy.
            self._probed[probe_key] = isolation.run_probe(
                lambda: batching_probe.probe(
                    self._template,
                    decision.strategy,
                    decision.chunk,
                    params,
                    buffers,
                    inputs,
                    self.shared_input,
                ),
                decision.strategy,
                ran=decision.reason == "measured",
            )
        self._isolation = self._probed.get(probe_key)
        if not self._laid_out and self.match_gradient_layout and torch.is_grad_enabled():
            batching_run.match_gradient_layout(
                self._template,
                decision.strategy,
                decision.chunk,
                params,
                buffers,
                inputs,
                self.shared_input,
            )
            self._laid_out = True
        self._decisions[key] = decision
        self._decision = decision
        return decision

    def _stacked_allowed(
        self,
        key: tuple[Any, ...],
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        inputs: Sequence[Any],
    ) -> tuple[tuple[str, ...], dict[str, str]]:
        """Whether "stacked" may run these inputs: planned, and equal to vmap on them.

        Checked once per key and BatchModule, in every process (a decision from the disk
        cache is never trusted for correctness). Returns ``(extra, refused)``: the
        strategies to offer beyond the general ones, and why "stacked" was refused.

        Raises:
            ArgumentError: ``strategy="stacked"`` and it differs from vmap here.
        """
        if self.strategy not in ("auto", "stacked") or self._stacked is None:
            return (), {}
        if key not in self._stacked_checks:
            self._stacked_checks[key] = batching_run.check_stacked(
                self._template, params, buffers, inputs, self.shared_input
            )
        found = self._stacked_checks[key]
        if found is None:
            return ("stacked",), {}
        if self.strategy == "stacked":
            raise ArgumentError(f'strategy="stacked" does not compute what vmap does here: {found}')
        return (), {"stacked": f"refused: {found}"}

    def tune(self, *inputs: Any) -> str:
        """Chooses the strategy (and probes isolation) for these inputs now.

        The first call does the same by itself. Returns `explain`.
        """
        self._check_inputs(inputs)
        self._decide(inputs)
        return self.explain()

    def forward(self, *inputs: Any) -> Any:
        """The members' outputs ``[batch, B, ...]`` for inputs ``[batch, B, ...]``."""
        self._check_inputs(inputs)
        params, buffers = tensors = self._tensors()
        decision = self._decide(inputs, tensors)
        return batching_run.run_members(
            self._template,
            decision.strategy,
            decision.chunk,
            params,
            buffers,
            inputs,
            self.shared_input,
        )

    def explain(self) -> str:
        """The strategy in use, why, the measured timings, and the isolation probe's result."""
        return dispatch.explain_text(self._decision, "torch", self.batch, self._isolation)

    def extra_repr(self) -> str:
        return f"batch={self.batch}, module={self._kind}, strategy={self.strategy!r}"


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


def _check_modes(first: nn.Module, module: nn.Module, name: str) -> None:
    """Each submodule in the mode it has in `first`: the batch runs in one mode per submodule."""
    ours = dict(first.named_modules())
    for sub, m in module.named_modules():
        if m.training != ours[sub].training:
            where = sub or "the module"
            raise members.refuse_member(
                name,
                f"{where} is in {_mode(m.training)} mode there but in "
                f"{_mode(ours[sub].training)} mode in the first member",
            )


def _mode(training: bool) -> str:
    return "training" if training else "eval"


def _contiguous_state(module: nn.Module, state: dict[str, Any], prefix: str, local: Any) -> None:
    """state_dict() values are contiguous (safetensors refuses strided tensors)."""
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and not value.is_contiguous():
            state[name] = value.contiguous()
