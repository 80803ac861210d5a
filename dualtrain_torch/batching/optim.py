"""Per-member training under torch: SGD, Adam and AdamW with ``[batch]`` hyper-parameters.

`member_optimizer` builds a `MemberOptimizer`, a ``torch.optim.Optimizer`` over a
`BatchModule`'s ``[batch, ...]`` parameters. Each member i steps exactly as
``torch.optim.SGD``/``Adam``/``AdamW`` would step member i alone with its own learning rate,
momentum, betas, eps and weight decay (torch's single-tensor formulas, broadcast over the
leading member dimension); members with ``active`` False are left bit for bit as they were
(parameters and optimizer state); `max_grad_norm` clips each member's gradient by that
member's own global norm, as ``clip_grad_norm_`` clips one model. docs/batching.md,
"Per-member hyper-parameters".

`MemberOptimizer.step` updates all members at once, with no loop over them: the operations
of torch's single-tensor SGD/Adam, in its order, each with ``[batch, 1, ...]`` per-member
values (a Python float, as torch passes it, where all members share a value); Adam's bias
corrections are computed in Python floats, as torch computes them. Adam and AdamW members
of `_FUSED_MIN` elements or more (on a CPU or CUDA device, in a dense layout) step instead
by torch's fused kernel, one call per active member over its rows: each steps exactly as
``torch.optim.Adam(fused=True)`` steps it alone. Which of the two a member takes depends
on its size alone, never on the other members (paused, clipped), so a member's arithmetic
is its own either way.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch import nn

from dualtrain.batching import hyper as hyper_checks
from dualtrain.batching.members import check_leading
from dualtrain.errors import ArgumentError, bad_argument

__all__ = ["MemberOptimizer", "member_optimizer"]

# Hyper-parameters and step counts are float64 [batch] tensors on the parameters' device,
# so bias corrections are computed as torch computes them (in Python floats).
_HYPER_DTYPE = torch.float64
_NUMBERS = ("lr", "momentum", "beta1", "beta2", "eps", "weight_decay")


def _member_tensors(params: object, batch: int) -> list[torch.Tensor]:
    if isinstance(params, nn.Module):
        params = list(params.parameters())
    if isinstance(params, torch.Tensor) or not isinstance(params, Iterable):
        raise bad_argument("params", params, "a BatchModule or an iterable of its parameters")
    tensors = list(params)
    if not tensors:
        raise bad_argument("params", tensors, "at least one parameter")
    for i, p in enumerate(tensors):
        if isinstance(p, dict):
            raise bad_argument("params", p, "tensors (one group: per-member values replace groups)")
        if not isinstance(p, torch.Tensor) or not p.is_floating_point() or not p.is_leaf:
            raise bad_argument(f"params[{i}]", p, "a floating-point leaf tensor")
        check_leading(f"params[{i}]", tuple(p.shape), batch, "[batch, ...]")
    if len({p.device for p in tensors}) > 1:
        raise bad_argument("params", [p.device for p in tensors], "tensors on one device")
    return tensors


def _group_values(hyper: hyper_checks.MemberHyper, device: torch.device) -> dict[str, Any]:
    # "member_" keys: torch's schedulers rewrite "lr", "momentum" and "betas" as floats.
    values: dict[str, Any] = {
        f"member_{k}": torch.as_tensor(v, dtype=_HYPER_DTYPE, device=device)
        for k, v in hyper.arrays().items()
    }
    values.setdefault("member_max_grad_norm", None)
    values["active"] = torch.as_tensor(hyper.active, device=device)
    values["name"], values["batch"], values["nesterov"] = hyper.name, hyper.batch, hyper.nesterov
    return values


class MemberOptimizer(torch.optim.Optimizer):
    """SGD, Adam or AdamW whose hyper-parameters are one value per member.

    Built by `member_optimizer` (which documents the arguments). The single parameter
    group holds ``member_lr``, ``member_momentum``, ``member_beta1``, ``member_beta2``,
    ``member_eps``, ``member_weight_decay`` and ``member_max_grad_norm`` (None, or float64
    ``[batch]`` tensors) and ``active`` (``[batch]`` bools); change them between steps with
    `set_hyper` (checked), never by hand. Its ``lr`` is a float factor, 1.0 at first, that
    multiplies every member's learning rate: torch's LR schedulers scale it, so a
    scheduler scales all members' rates alike (member i's rate is ``lr * member_lr[i]``). Every
    parameter's state keeps a ``[batch]`` ``step`` count: a member's count moves only when
    it steps. ``last_grad_norm`` is each member's gradient norm before clipping (``[batch]``,
    set by `step` when clipping is on).
    """

    def __init__(self, params: object, hyper: hyper_checks.MemberHyper) -> None:
        tensors = _member_tensors(params, hyper.batch)
        defaults = {"lr": 1.0} | _group_values(hyper, tensors[0].device)
        super().__init__(tensors, defaults)
        self.last_grad_norm: torch.Tensor | None = None
        self._forget()

    def _forget(self) -> None:
        """Drops what the step caches (after the state or the group were replaced)."""
        self._plan: _Plan | None = None
        # ids of the parameters whose every member's momentum buffer has started
        self._ready: set[int] = set()
        # id(param) -> (its step tensor, that tensor's version, its values): Adam's bias
        # corrections come from host floats without reading the device each step
        self._host_steps: dict[int, tuple[torch.Tensor, int, tuple[float, ...]]] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("last_grad_norm", None)
        self._forget()

    # -- hyper-parameters ----------------------------------------------------------------

    @property
    def hyper(self) -> hyper_checks.MemberHyper:
        """The current hyper-parameters as NumPy arrays (a snapshot)."""
        group = self.param_groups[0]

        def host(key: str) -> np.ndarray:
            return group[key].detach().cpu().numpy().copy()

        clip = group["member_max_grad_norm"]
        return hyper_checks.MemberHyper(
            name=group["name"],
            batch=group["batch"],
            nesterov=group["nesterov"],
            max_grad_norm=None if clip is None else host("member_max_grad_norm"),
            active=host("active"),
            **{k: host(f"member_{k}") for k in _NUMBERS},
        )

    def set_hyper(self, **changes: object) -> None:
        """Changes hyper-parameters between steps (checked first, as `member_optimizer`).

        Keywords: ``lr``, ``weight_decay``, ``momentum`` (SGD), ``betas``, ``eps`` (Adam,
        AdamW), ``max_grad_norm`` (if built with one), ``active``; each a float or
        ``[batch]`` values.

        Raises:
            ArgumentError: an unknown keyword or a bad value; nothing changes then.
        """
        new = hyper_checks.check_changes(self.hyper, changes)
        group = self.param_groups[0]
        group.update(_group_values(new, group["active"].device))

    # torch.optim.Optimizer's add_param_group and zero_grad import torch._dynamo on their
    # first call (2-3 s of a job's first step on a CPU); these do what torch's do for this
    # optimizer's one group, without it.

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Torch's `add_param_group` for the one group `member_optimizer` builds.

        Raises:
            ArgumentError: a second group (every member's tensors are in the first; the
                step reads only it), or a tensor listed twice.
        """
        if self.param_groups:
            raise ArgumentError(
                "member_optimizer holds one group, every member's [batch, ...] tensors; "
                "got a second with add_param_group: build another optimizer for those"
            )
        tensors = list(param_group["params"])
        if len({id(t) for t in tensors}) != len(tensors):
            raise bad_argument("params", [tuple(t.shape) for t in tensors], "no tensor twice")
        for name, default in self.defaults.items():
            param_group.setdefault(name, default)
        param_group["params"] = tensors
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Torch's `zero_grad`: every gradient set to None (or zeroed in place)."""
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
                continue
            if p.grad.grad_fn is not None:
                p.grad.detach_()
            else:
                p.grad.requires_grad_(False)
            p.grad.zero_()

    def set_active(self, active: object) -> None:
        """Which members step (``[batch]`` bools; None: all). Same as ``set_hyper(active=)``."""
        self.set_hyper(active=active)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Torch's `load_state_dict`, refusing another optimizer's or member count's state."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        mine = self.param_groups[0]
        if not isinstance(groups, list) or len(groups) != 1:
            raise bad_argument("state_dict", type(state_dict), "a MemberOptimizer's state_dict")
        for key in ("name", "batch", "nesterov"):
            if groups[0].get(key) != mine[key]:
                raise bad_argument(
                    f"state_dict's {key}", groups[0].get(key), f"{mine[key]!r}, as built"
                )
        clip = groups[0].get("member_max_grad_norm")
        if (clip is None) != (mine["member_max_grad_norm"] is None):
            raise bad_argument("state_dict's member_max_grad_norm", clip, "set iff built with one")
        device = mine["active"].device
        super().load_state_dict(state_dict)
        self._forget()
        group = self.param_groups[0]
        for key, value in group.items():
            if isinstance(value, torch.Tensor):  # hyper tensors follow the parameters
                group[key] = value.to(device)

    # -- the step --------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step of every active member; returns `closure`'s loss (if given)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group = self.param_groups[0]
        params, grads = [], []
        for p in group["params"]:
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise ArgumentError("member_optimizer does not take sparse gradients")
                params.append(p)
                grads.append(p.grad)
        if not params:
            return loss
        plan = self._current_plan(group)
        coef = None
        if group["member_max_grad_norm"] is not None:
            coef = _Lead(self._clip_coef(grads, group["member_max_grad_norm"]))
        states = [self.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:
                state["step"] = step = torch.zeros(
                    plan.batch, dtype=_HYPER_DTYPE, device=plan.device
                )
                self._host_steps[id(p)] = (step, step._version, (0.0,) * plan.batch)
        slots = self._init_slots(group["name"], params, states, plan)
        if not plan.any_active:
            return loss
        held = None
        if plan.inactive is not None:
            # Every member is computed; the inactive ones' rows are put back afterwards,
            # bit for bit (cheaper than selecting every element, and exactly the same
            # arithmetic for the active members as when all are active).
            held = [
                t for p, s in zip(params, states, strict=True) for t in (p, *(s[k] for k in slots))
            ]
            rows = [t.index_select(0, plan.inactive) for t in held]
        steps = [s["step"] for s in states]
        ops = _Operands(params, grads, states, plan, coef)
        if group["name"] == "sgd":
            self._sgd(ops, group["nesterov"])
        else:
            counts = [self._counts(p, t) for p, t in zip(params, steps, strict=True)]
            self._adam(ops, group["name"] == "adamw", counts)
        if held is None:
            torch._foreach_add_(steps, 1.0)
        else:
            for t, kept in zip(held, rows, strict=True):
                t.index_copy_(0, plan.inactive, kept)
            torch._foreach_add_(steps, [plan.active] * len(steps))
        if group["name"] != "sgd":
            for p, t, c in zip(params, steps, counts, strict=True):
                moved = tuple(map(operator.add, c, plan.host_active))
                self._host_steps[id(p)] = (t, t._version, moved)
        return loss

    def _counts(self, p: torch.Tensor, step: torch.Tensor) -> tuple[float, ...]:
        """`step`'s values, from the copy the optimizer keeps on the host.

        Read from the tensor (a host sync on an accelerator) only when the copy is not of
        this tensor as it is now (a new or loaded state, a change by hand).
        """
        kept = self._host_steps.get(id(p))
        if kept is not None and kept[0] is step and kept[1] == step._version:
            return kept[2]
        return tuple(step.tolist())

    def _current_plan(self, group: dict[str, Any]) -> _Plan:
        plan = self._plan
        if plan is None or not plan.built_from(group):
            plan = self._plan = _Plan(group)
        factor = group["lr"]
        plan.set_factor(float(factor.item() if isinstance(factor, torch.Tensor) else factor))
        return plan

    def _init_slots(
        self, name: str, params: list[torch.Tensor], states: list[dict[str, Any]], plan: _Plan
    ) -> tuple[str, ...]:
        """Creates missing state; the names of the state tensors this step changes."""
        if name != "sgd":
            for p, state in zip(params, states, strict=True):
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            return ("exp_avg", "exp_avg_sq")
        if not plan.any_moving:  # torch keeps no buffer without momentum, nor touches one
            return ()
        for p, state in zip(params, states, strict=True):
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                # 0/1 in the parameter's dtype: load_state_dict casts every non-step
                # state tensor to it (a bool would come back as a float).
                state["buffer_ready"] = torch.zeros(plan.batch, dtype=p.dtype, device=p.device)
                self._ready.discard(id(p))
        return ("momentum_buffer", "buffer_ready")

    def _clip_coef(self, grads: list[torch.Tensor], max_norm: torch.Tensor) -> torch.Tensor:
        # clip_grad_norm_'s formula, one global norm per member: the norm of the params'
        # norms, coefficient max_norm / (norm + 1e-6) clamped at 1.
        batch = max_norm.shape[0]
        norms = [torch.linalg.vector_norm(g.reshape(batch, -1), 2, dim=1) for g in grads]
        total = torch.linalg.vector_norm(torch.stack(norms), 2, dim=0)
        self.last_grad_norm = total
        return torch.clamp(max_norm.to(total.dtype) / (total + 1e-6), max=1.0)

    def _sgd(self, ops: _Operands, nesterov: bool) -> None:
        params, grads, states, plan, coef = ops
        momentum = plan.any_moving
        # Fast: every member has momentum and a started buffer (known from an earlier
        # all-member step, no device read). Else torch's first step copies d_p into the
        # buffer, and members without momentum step by d_p, selected member by member.
        fast = not momentum or (plan.all_moving and all(id(p) in self._ready for p in params))
        per_param = [
            [p, g] + ([s["momentum_buffer"]] if momentum else [])
            for p, g, s in zip(params, grads, states, strict=True)
        ]
        # SGD makes three passes and no temporaries: blocks would not pay their calls.
        for bucket in _buckets(plan, per_param, blocks=False):
            ps = [t[0] for _, t in bucket]
            ds = _direction(plan, ps, [t[1] for _, t in bucket], coef, coupled=True)
            if momentum:
                bufs = [t[2] for _, t in bucket]
                m = plan.per_list("momentum", bufs)
                if fast:
                    torch._foreach_mul_(bufs, m)
                    torch._foreach_add_(bufs, ds)
                    ds = _plus(ds, bufs, m) if nesterov else bufs
                else:
                    ds = [
                        _sgd_start(plan, buf, d, states[j]["buffer_ready"], nesterov)
                        for (j, _), buf, d in zip(bucket, bufs, ds, strict=True)
                    ]
            _plus_(ps, ds, plan.per_list("neg_lr", ps))
        if momentum and not fast:
            for s in states:
                s["buffer_ready"].masked_fill_(plan.moving, 1)
            if plan.inactive is None and plan.all_moving:
                self._ready.update(id(p) for p in params)

    def _adam(self, ops: _Operands, decoupled: bool, counts: list[tuple[float, ...]]) -> None:
        params, grads, states, plan, coef = ops
        # Which formula a member steps by depends on its own size only, never on which
        # other members are paused or clipped: a member's arithmetic is its own.
        per_member = sum(p[0].numel() for p in params)
        if per_member >= _FUSED_MIN:
            rows = _member_rows(params, grads, states, coef)
            if rows is not None:
                _fused_members(rows, plan, decoupled, counts)
                return
        distinct: dict[tuple[float, ...], _AdamFactors] = {}
        factors = [distinct.get(c) or distinct.setdefault(c, _AdamFactors(plan, c)) for c in counts]
        per_param = [
            [p, g, s["exp_avg"], s["exp_avg_sq"]]
            for p, g, s in zip(params, grads, states, strict=True)
        ]
        # torch's single-tensor Adam, in its order: (AdamW) p *= 1 - lr wd; (Adam) g +=
        # wd p; m.lerp_(g, 1 - b1); v = v b2 + ((1 - b2) g) g; p += (-step_size m) /
        # (sqrt(v) / sqrt(bias2) + eps), with step_size = lr / bias1 per member.
        for bucket in _buckets(plan, per_param, blocks=True):
            ps, gs, ms, vs = ([t[k] for _, t in bucket] for k in range(4))
            fs = [factors[j] for j, _ in bucket]
            gs = _direction(plan, ps, gs, coef, coupled=not decoupled)
            if decoupled and plan.any_wd:
                torch._foreach_mul_(ps, plan.per_list("decay", ps))
            torch._foreach_lerp_(ms, gs, plan.per_list("w1", ms))
            torch._foreach_mul_(vs, plan.per_list("beta2", vs))
            w2 = plan.per_list("w2", vs)
            if isinstance(w2, float):
                torch._foreach_addcmul_(vs, gs, gs, value=w2)
            else:  # (1 - b2) g first, as addcmul's scalar value multiplies first
                torch._foreach_addcmul_(vs, torch._foreach_mul(gs, w2), gs)
            denoms = torch._foreach_sqrt(vs)
            torch._foreach_div_(denoms, _scalars_or_views(fs, ps, 1))
            torch._foreach_add_(denoms, plan.per_list("eps", vs))
            steps = _scalars_or_views(fs, ps, 0)
            if isinstance(steps[0], float):  # torch's addcdiv_(m, denom, value=-step_size)
                torch._foreach_addcdiv_(ps, ms, denoms, steps)
            else:  # (-step_size m) first, as addcdiv's scalar value multiplies first
                torch._foreach_addcdiv_(ps, torch._foreach_mul(ms, steps), denoms)


# torch's fused Adam kernels: they take each hyper-parameter as one scalar, so they run
# once per member over that member's rows (as N separate trainings would call them).
_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Below this many elements per member, N kernel calls cost more than one vectorized
# update over every member (16 members: 64-64-4 MLPs, 4.4k each, 1.3 ms fused member by
# member against 0.4 ms vectorized; 3072-64-4 MLPs, 197k each, 8.5 against 14 ms).
_FUSED_MIN = 32768


def _dense_rows(t: torch.Tensor) -> torch.Tensor | None:
    """`t` as ``[batch, n]`` rows (a view), when each member's block is dense in memory.

    Any layout of the member's block will do (a transposed one from vmap's gradients):
    Adam is elementwise, so only the four tensors' layouts must agree.
    """
    if t.dim() == 0 or t.shape[0] == 0:
        return None
    per = t[0].numel()
    if t.dim() > 1 and t.stride(0) != per:
        return None
    expected = 1
    for stride, size in sorted(zip(t.stride()[1:], t.shape[1:], strict=True)):
        if size == 1:
            continue
        if stride != expected:
            return None
        expected *= size
    return t.as_strided((t.shape[0], per), (per if t.dim() > 1 else t.stride(0), 1))


def _member_rows(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    states: list[dict[str, Any]],
    coef: _Lead | None,
) -> list[tuple[torch.Tensor, ...]] | None:
    """``(p, g, m, v)`` rows of each parameter for the fused kernels, or None (not all fit).

    A gradient laid out unlike its parameter, or clipped (`coef`: each member's clipping
    factor, multiplied as ``clip_grad_norm_`` multiplies), is first written to a tensor
    laid out like the parameter; ``.grad`` itself is left as it was.
    """
    out = []
    for p, g, s in zip(params, grads, states, strict=True):
        if p.device.type not in ("cpu", "cuda") or _dense_rows(p) is None:
            return None
        if coef is not None:
            g = torch.mul(g, coef.of(g), out=torch.empty_like(p))
        elif g.stride() != p.stride() and g.shape == p.shape and g.dtype == p.dtype:
            g = torch.empty_like(p).copy_(g)
        four = (p, g, s["exp_avg"], s["exp_avg_sq"])
        if (
            p.device.type not in ("cpu", "cuda")
            or p.dtype not in _FUSED_DTYPES
            or any(t.dtype != p.dtype or t.device != p.device for t in four)
            or any(t.shape != p.shape or t.stride() != p.stride() for t in four)
        ):
            return None
        rows = tuple(_dense_rows(t) for t in four)
        if any(r is None for r in rows):
            return None
        out.append(cast(tuple[torch.Tensor, ...], rows))
    return out


def _fused_members(
    rows: list[tuple[torch.Tensor, ...]],
    plan: _Plan,
    decoupled: bool,
    counts: list[tuple[float, ...]],
) -> None:
    """Every active member's Adam (AdamW) step by torch's fused kernel, member by member.

    Member i's call is the one ``torch.optim.Adam(fused=True)`` makes for a model of its
    own: its learning rate (times the schedulers' factor), betas, eps, weight decay and
    step count (after this step), over its rows of every parameter.
    """
    kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_
    device = rows[0][0].device
    steps = torch.tensor(
        [[c + 1 for c in member] for member in counts], dtype=torch.float32, device=device
    )
    for i in range(plan.batch):
        if not plan.host_active[i]:
            continue  # a paused member: its rows are not touched
        kernel(
            [r[0][i] for r in rows],
            [r[1][i] for r in rows],
            [r[2][i] for r in rows],
            [r[3][i] for r in rows],
            [],
            list(steps[:, i].unbind(0)),
            lr=plan.rates[i],
            beta1=plan.beta1[i],
            beta2=plan.beta2[i],
            weight_decay=plan.host_wd[i],
            eps=plan.host_eps[i],
            amsgrad=False,
            maximize=False,
        )


# Adam runs block by block on the CPU: a block's operands and temporaries stay in the
# core's caches between its eight passes, so main memory is read about once a step
# (measured on 16 members of a 3072-64-4 MLP: 256 KiB to 1 MiB blocks beat whole tensors
# by about 1.3x; smaller blocks pay more calls).
_BLOCK_BYTES = 512 * 1024
_MIN_COLUMNS = 256


def _sources(group: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(group[k] for k in _PLAN_KEYS)


_PLAN_KEYS = (*(f"member_{k}" for k in _NUMBERS), "active")


def _shared(values: list[float] | tuple[float, ...]) -> float | None:
    """The members' common value, or None when they differ."""
    first = values[0]
    return first if values.count(first) == len(values) else None


class _Lead:
    """A ``[batch]`` tensor as ``[batch, 1, ...]`` views, one per dtype and rank asked for."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values
        self._views: dict[tuple[torch.dtype, int], torch.Tensor] = {}

    def of(self, like: torch.Tensor) -> torch.Tensor:
        key = (like.dtype, like.dim())
        view = self._views.get(key)
        if view is None:
            values = self.values.to(like.dtype) if self.values.is_floating_point() else self.values
            view = self._views[key] = values.view(-1, *([1] * (like.dim() - 1)))
        return view


class _Operands(NamedTuple):
    """What one step updates, as `_sgd` and `_adam` take it.

    Attributes:
        params: the group's parameters that have a gradient.
        grads: their gradients (``.grad``, left as they are).
        states: their optimizer states.
        plan: the group's hyper-parameters (`_Plan`).
        coef: each member's clipping factor, or None (no clipping).
    """

    params: list[torch.Tensor]
    grads: list[torch.Tensor]
    states: list[dict[str, Any]]
    plan: _Plan
    coef: _Lead | None


class _Plan:
    """The group's hyper-parameters ready for the update.

    Rebuilt when `set_hyper` or `load_state_dict` replace the group's tensors (they are
    never changed in place).

    Each value is a float64 ``[batch]`` tensor (`_Lead` views in the parameters' dtype),
    and a Python float where every member shares it: the update then calls the same
    scalar kernels as ``torch.optim``. Flags and indices are read from the device once
    here, not on every step.
    """

    def __init__(self, group: dict[str, Any]) -> None:
        self.sources = _sources(group)
        active = group["active"]
        self.device = active.device
        self.batch = int(active.shape[0])
        flags = [bool(a) for a in active.tolist()]
        missing = [i for i, a in enumerate(flags) if not a]
        self.inactive = torch.tensor(missing, device=self.device) if missing else None
        self.active = active.to(_HYPER_DTYPE)
        self.host_active = [float(a) for a in flags]
        self.any_active = any(flags)
        beta1, beta2 = group["member_beta1"], group["member_beta2"]
        self.lr = group["member_lr"]
        self.moving = group["member_momentum"] != 0
        values = {
            "momentum": group["member_momentum"],
            "w1": 1 - beta1,
            "beta2": beta2,
            "w2": 1 - beta2,
            "eps": group["member_eps"],
            "wd": group["member_weight_decay"],
        }
        host = {k: v.tolist() for k, v in values.items()}
        self.host_eps, self.host_wd = host["eps"], host["wd"]
        host["lr"] = self.host_lr = self.lr.tolist()
        host["beta1"] = self.beta1 = beta1.tolist()
        self.beta2 = host["beta2"]
        self.uniform: dict[str, float | None] = {k: _shared(v) for k, v in host.items()}
        self.leads = {k: _Lead(v) for k, v in values.items()}
        self.leads["moving"] = _Lead(self.moving)
        self.any_wd = any(host["wd"])
        self.any_moving = any(host["momentum"])
        self.all_moving = all(host["momentum"])
        self.factor: float | None = None

    def built_from(self, group: dict[str, Any]) -> bool:
        return all(map(operator.is_, self.sources, _sources(group)))

    def set_factor(self, factor: float) -> None:
        """The LR schedulers' factor (the group's ``lr``): the rates that depend on it."""
        if factor == self.factor:
            return
        self.factor = factor
        self.rates = [r * factor for r in self.host_lr]
        lr = self.lr * factor
        self.leads["neg_lr"] = _Lead(-lr)
        self.leads["decay"] = _Lead(1 - lr * self.leads["wd"].values)
        shared, wd = self.uniform["lr"], self.uniform["wd"]
        self.uniform["neg_lr"] = None if shared is None else -(shared * factor)
        self.uniform["decay"] = None if shared is None or wd is None else 1 - (shared * factor) * wd

    def per_list(self, name: str, likes: list[torch.Tensor]) -> float | list[torch.Tensor]:
        """`name` for each of `likes`: the shared float, or ``[batch, 1, ...]`` views."""
        shared = self.uniform[name]
        return shared if shared is not None else self.view_list(name, likes)

    def view_list(self, name: str, likes: list[torch.Tensor]) -> list[torch.Tensor]:
        lead = self.leads[name]
        return [lead.of(t) for t in likes]


class _AdamFactors:
    """``-lr / bias1`` and ``sqrt(bias2)`` of each member for one step from step counts.

    Python floats, computed as torch.optim computes them (``bias1 = 1 - beta1 ** t``, t the
    count after this step). A value every member shares stays a float (a scalar kernel
    argument, as in torch.optim); else they become ``[batch, 1, ...]`` tensors in the
    parameters' dtype.
    """

    def __init__(self, plan: _Plan, counts: tuple[float, ...]) -> None:
        n = len(counts)
        together = _shared(counts) is not None  # one count: shared betas give one bias each
        ts = [c + 1 for c in counts]
        b1, b2 = plan.uniform["beta1"], plan.uniform["beta2"]
        if together and b1 is not None:
            bias1 = [1 - b1 ** ts[0]] * n
        else:
            bias1 = [1 - b**t for b, t in zip(plan.beta1, ts, strict=True)]
        if together and b2 is not None:
            roots = [(1 - b2 ** ts[0]) ** 0.5] * n
        else:
            roots = [(1 - b**t) ** 0.5 for b, t in zip(plan.beta2, ts, strict=True)]
        steps = [-(lr / b) for lr, b in zip(plan.rates, bias1, strict=True)]
        self.step, self.root = _shared(steps), _shared(roots)
        self._values = [steps, roots]
        self._uploaded: dict[torch.dtype, Any] = {}
        self._views: dict[tuple[torch.dtype, int], tuple[torch.Tensor, ...]] = {}

    def views(self, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(steps, roots)`` as ``[batch, 1, ...]`` tensors shaped for `like`."""
        key = (like.dtype, like.dim())
        views = self._views.get(key)
        if views is None:
            both = self._uploaded.get(like.dtype)
            if both is None:
                both = self._uploaded[like.dtype] = _upload(self._values, like)
            shape = (-1, *([1] * (like.dim() - 1)))
            if isinstance(both, np.ndarray):  # a CPU float: NumPy's views cost less than torch's
                views = (
                    torch.from_numpy(both[0].reshape(shape)),
                    torch.from_numpy(both[1].reshape(shape)),
                )
            else:
                views = both.view(2, *shape).unbind(0)
            self._views[key] = views
        return views


_NUMPY = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16}


def _upload(values: list[list[float]], like: torch.Tensor) -> np.ndarray | torch.Tensor:
    """Host floats in `like`'s dtype for its device (NumPy for the CPU), without a sync."""
    if like.device.type == "cpu" and like.dtype in _NUMPY:
        return np.array(values, dtype=_NUMPY[like.dtype])  # rounds as torch's casts do
    if like.device.type != "cuda":
        return torch.tensor(values, dtype=like.dtype, device=like.device)
    host = torch.tensor(values, dtype=like.dtype, pin_memory=True)
    return host.to(like.device, non_blocking=True)


def _scalars_or_views(
    factors: list[_AdamFactors], likes: list[torch.Tensor], which: int
) -> list[float] | list[torch.Tensor]:
    """Each piece's steps (`which` 0) or roots (1): floats when every piece has one."""
    shared = [f.step if which == 0 else f.root for f in factors]
    if all(s is not None for s in shared):
        return cast(list[float], shared)
    return [f.views(t)[which] for f, t in zip(factors, likes, strict=True)]


Bucket = list[tuple[int, list[torch.Tensor]]]


def _buckets(plan: _Plan, per_param: list[list[torch.Tensor]], blocks: bool) -> list[Bucket]:
    """The update's pieces, ``(parameter index, [param, grad, *state])``, in buckets.

    A bucket is updated by one ``torch._foreach_*`` call per operation. Without `blocks`,
    or off the CPU: one bucket of whole tensors. Else a parameter larger than a block is
    cut into ``[batch, columns]`` blocks of its ``[batch, -1]`` view (a bucket each);
    smaller ones share buckets of a few blocks.
    """
    if not blocks or plan.device.type != "cpu":
        return [list(enumerate(per_param))]
    batch = plan.batch
    out: list[Bucket] = []
    small: Bucket = []
    size = 0
    for j, tensors in enumerate(per_param):
        p = tensors[0]
        block = _BLOCK_BYTES // p.element_size()
        columns = max(_MIN_COLUMNS, block // batch)
        n = p.numel() // batch
        if n > columns and p.is_contiguous() and all(t.is_contiguous() for t in tensors[2:]):
            flat = [t.reshape(batch, n) for t in tensors]  # views, but for a strided grad
            pieces = zip(*(torch.split(f, columns, dim=1) for f in flat), strict=True)
            out.extend([(j, list(piece))] for piece in pieces)
            continue
        if small and size + p.numel() > 4 * block:
            out.append(small)
            small, size = [], 0
        small.append((j, tensors))
        size += p.numel()
    if small:
        out.append(small)
    return out


def _plus(
    xs: list[torch.Tensor], ys: list[torch.Tensor], scale: float | list[torch.Tensor]
) -> list[torch.Tensor]:
    """``x + scale * y``: torch's ``add(alpha=)`` for a shared scale, else ``addcmul``."""
    if isinstance(scale, float):
        return list(torch._foreach_add(xs, ys, alpha=scale))
    return list(torch._foreach_addcmul(xs, ys, scale))


def _plus_(
    xs: list[torch.Tensor], ys: list[torch.Tensor], scale: float | list[torch.Tensor]
) -> None:
    """``x += scale * y`` in place (as `_plus`)."""
    if isinstance(scale, float):
        torch._foreach_add_(xs, ys, alpha=scale)
    else:
        torch._foreach_addcmul_(xs, ys, scale)


def _direction(
    plan: _Plan,
    ps: list[torch.Tensor],
    gs: list[torch.Tensor],
    coef: _Lead | None,
    coupled: bool,
) -> list[torch.Tensor]:
    """The gradients clipped and, if `coupled`, with the L2 term ``wd * p`` added.

    New tensors where either applies: ``.grad`` is left as it was.
    """
    if coef is not None:
        gs = list(torch._foreach_mul(gs, [coef.of(g) for g in gs]))
    if coupled and plan.any_wd:
        gs = _plus(gs, ps, plan.per_list("wd", ps))
    return gs


def _sgd_start(
    plan: _Plan, buf: torch.Tensor, d: torch.Tensor, ready: torch.Tensor, nesterov: bool
) -> torch.Tensor:
    """SGD's momentum where some buffer has not started or some member has none.

    Started members decay and add, the others copy d_p (torch's first step); members
    without momentum keep their buffer and step by d_p. Returns the step direction.
    """
    m = plan.leads["momentum"].of(buf)
    new = torch.where(_Lead(ready).of(buf) != 0, buf * m + d, d)
    moving = plan.leads["moving"].of(buf)
    buf.copy_(torch.where(moving, new, buf))
    # the fast path's arithmetic exactly (a shared momentum: add(alpha=)), so a member
    # steps alike whichever path ran
    moved = _plus([d], [new], plan.per_list("momentum", [buf]))[0] if nesterov else new
    return torch.where(moving, moved, d)


def member_optimizer(
    params: Iterable[torch.Tensor] | nn.Module,
    name: str,
    batch: int,
    *,
    lr: object,
    momentum: object = 0.0,
    betas: object = (0.9, 0.999),
    eps: object = 1e-8,
    weight_decay: object = 0.0,
    nesterov: bool = False,
    max_grad_norm: object = None,
    active: object = None,
) -> MemberOptimizer:
    """An optimizer that steps each member of a `BatchModule` with its own hyper-parameters.

    Member i follows ``torch.optim.SGD`` / ``Adam`` / ``AdamW`` run on member i alone with
    ``lr[i]``, ``momentum[i]``, ... (torch's formulas; dampening 0; Adam's weight decay is
    coupled L2, AdamW's decoupled). Each hyper-parameter is a float (every member) or
    ``[batch]`` values (list, NumPy, torch).

    Args:
        params: the BatchModule, or its ``[batch, ...]`` parameters (one group).
        name: ``"sgd"``, ``"adam"`` or ``"adamw"``.
        batch: the member count (every parameter's leading dimension).
        lr: learning rates, >= 0.
        momentum: SGD's momentum, >= 0 (SGD only).
        betas: Adam's ``(beta1, beta2)``, each in [0, 1) (Adam, AdamW only).
        eps: Adam's epsilon, >= 0 (Adam, AdamW only).
        weight_decay: >= 0 (0 for AdamW too, unlike torch's 0.01 default).
        nesterov: SGD's Nesterov momentum (needs every member's momentum > 0); fixed.
        max_grad_norm: None (no clipping) or each member's clipping norm (``inf``: that
            member is not clipped); member i's gradient is scaled as
            ``clip_grad_norm_(member i's params, max_grad_norm[i])`` would scale it
            (``.grad`` itself is left unscaled).
        active: None (all) or ``[batch]`` bools; inactive members do not step: their
            parameters and state stay bit for bit as they were.

    Raises:
        ArgumentError: a bad name or value (wrong length, negative, not finite, a beta
            outside [0, 1), a keyword the optimizer does not read set off its default).
        ShapeError: a parameter whose leading dimension is not `batch`.
    """
    given = {k: v for k, v in locals().items() if k != "params"}  # the keywords as called
    return MemberOptimizer(params, hyper_checks.check_hyper(**given))
