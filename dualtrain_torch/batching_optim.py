"""Per-member training under torch: SGD, Adam and AdamW with ``[batch]`` hyper-parameters.

`member_optimizer` builds a `MemberOptimizer`, a ``torch.optim.Optimizer`` over a
`BatchModule`'s ``[batch, ...]`` parameters. Each member i steps exactly as
``torch.optim.SGD``/``Adam``/``AdamW`` would step member i alone with its own learning rate,
momentum, betas, eps and weight decay (torch's single-tensor formulas, broadcast over the
leading member dimension); members with ``active`` False are left bit for bit as they were
(parameters and optimizer state); `max_grad_norm` clips each member's gradient by that
member's own global norm, as ``clip_grad_norm_`` clips one model. docs/batching.md,
"Per-member hyper-parameters".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

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
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return loss
        grads = []
        for p in params:
            if p.grad.is_sparse:
                raise ArgumentError("member_optimizer does not take sparse gradients")
            grads.append(p.grad)
        if group["member_max_grad_norm"] is not None:
            grads = self._clip(grads, group["member_max_grad_norm"])
        active = group["active"]
        for p, g in zip(params, grads, strict=True):
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros_like(active, dtype=_HYPER_DTYPE)
            if group["name"] == "sgd":
                self._sgd(p, g, state, group)
            else:
                self._adam(p, g, state, group)
            state["step"].add_(active.to(_HYPER_DTYPE))
        return loss

    def _clip(self, grads: list[torch.Tensor], max_norm: torch.Tensor) -> list[torch.Tensor]:
        # clip_grad_norm_'s formula, one global norm per member: the norm of the params'
        # norms, coefficient max_norm / (norm + 1e-6) clamped at 1.
        batch = max_norm.shape[0]
        norms = [torch.linalg.vector_norm(g.reshape(batch, -1), 2, dim=1) for g in grads]
        total = torch.linalg.vector_norm(torch.stack(norms), 2, dim=0)
        self.last_grad_norm = total
        coef = torch.clamp(max_norm.to(total.dtype) / (total + 1e-6), max=1.0)
        return [g * _lead(coef, g) for g in grads]

    def _sgd(
        self, p: torch.Tensor, g: torch.Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        active, momentum = group["active"], group["member_momentum"]
        d_p = g + _lead(group["member_weight_decay"], p) * p
        moving = momentum != 0
        step = d_p
        if bool(moving.any()) or "momentum_buffer" in state:
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
                # 0/1 in the parameter's dtype: load_state_dict casts every non-step
                # state tensor to it (a bool would come back as a float).
                state["buffer_ready"] = torch.zeros(active.shape, dtype=p.dtype, device=p.device)
            buf = state["momentum_buffer"]
            ready = state["buffer_ready"] != 0
            m = _lead(momentum, p)
            # torch: the first step with a momentum copies d_p, later ones decay and add.
            new_buf = torch.where(_lead(ready, p), buf * m + d_p, d_p)
            moved = d_p + m * new_buf if group["nesterov"] else new_buf
            step = torch.where(_lead(moving, p), moved, d_p)
            keep = active & moving
            buf.copy_(torch.where(_lead(keep, p), new_buf, buf))
            state["buffer_ready"].masked_fill_(keep, 1)
        new_p = p + (-_lead(_rates(group), p)) * step
        p.copy_(torch.where(_lead(active, p), new_p, p))

    def _adam(
        self, p: torch.Tensor, g: torch.Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> None:
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        active, lr, wd = group["active"], _rates(group), group["member_weight_decay"]
        beta1, beta2 = group["member_beta1"], group["member_beta2"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        if group["name"] == "adamw":
            base = p * _lead(1 - lr * wd, p)  # decoupled: decay the weights themselves
        else:
            base = p
            g = g + _lead(wd, p) * p  # coupled: L2 in the gradient
        t = state["step"] + 1
        new_avg = exp_avg.lerp(g, _lead(1 - beta1, p))
        new_sq = exp_avg_sq * _lead(beta2, p) + _lead(1 - beta2, p) * (g * g)
        bias1, bias2 = 1 - beta1**t, 1 - beta2**t
        step_size = lr / bias1
        denom = new_sq.sqrt() / _lead(bias2.sqrt(), p) + _lead(group["member_eps"], p)
        new_p = base + _lead(-step_size, p) * (new_avg / denom)
        mask = _lead(active, p)
        p.copy_(torch.where(mask, new_p, p))
        exp_avg.copy_(torch.where(mask, new_avg, exp_avg))
        exp_avg_sq.copy_(torch.where(mask, new_sq, exp_avg_sq))


def _rates(group: dict[str, Any]) -> torch.Tensor:
    """Each member's learning rate: the schedulers' common factor times its own."""
    factor = group["lr"]
    if isinstance(factor, torch.Tensor):
        factor = factor.item()
    return group["member_lr"] * float(factor)


def _lead(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[batch]`` values shaped ``[batch, 1, ...]`` against `like` (floats in its dtype)."""
    if values.is_floating_point():
        values = values.to(like.dtype)
    return values.reshape(values.shape[0], *([1] * (like.dim() - 1)))


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
    hyper = hyper_checks.check_hyper(
        name,
        batch,
        lr=lr,
        momentum=momentum,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        nesterov=nesterov,
        max_grad_norm=max_grad_norm,
        active=active,
    )
    return MemberOptimizer(params, hyper)
