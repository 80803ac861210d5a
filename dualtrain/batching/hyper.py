"""Per-member optimizer hyper-parameters: the neutral checks behind `member_optimizer`.

Both adapters' ``member_optimizer`` (torch: an ``Optimizer``; JAX: an optax transformation)
validate here, so they accept and refuse the same values with the same words. A value is
a float (every member gets it) or one number per member (a list, a NumPy or framework
array of shape ``[batch]``); it comes back as a float64 ``[batch]`` NumPy array.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from dualtrain.errors import bad_argument
from dualtrain.validate import check_int

__all__ = [
    "CHANGEABLE",
    "DEFAULTS",
    "OPTIMIZERS",
    "MemberHyper",
    "check_active",
    "check_changes",
    "check_hyper",
    "check_optimizer",
    "per_member",
]

OPTIMIZERS = ("sgd", "adam", "adamw")
# The defaults of member_optimizer's keywords (torch's, but weight decay 0 for AdamW too).
DEFAULTS: dict[str, Any] = {
    "momentum": 0.0,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "nesterov": False,
    "max_grad_norm": None,
}
# Keywords each optimizer reads; the others must keep their defaults.
_OWN = {
    "sgd": ("lr", "momentum", "weight_decay", "nesterov", "max_grad_norm"),
    "adam": ("lr", "betas", "eps", "weight_decay", "max_grad_norm"),
    "adamw": ("lr", "betas", "eps", "weight_decay", "max_grad_norm"),
}
# What set_hyper may change between steps (nesterov is structure, fixed at construction).
CHANGEABLE = ("lr", "momentum", "betas", "eps", "weight_decay", "max_grad_norm", "active")


@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compare fields, not the whole
class MemberHyper:
    """Checked hyper-parameters, each a float64 ``[batch]`` array (`active`: bool)."""

    name: str
    batch: int
    lr: np.ndarray
    momentum: np.ndarray
    beta1: np.ndarray
    beta2: np.ndarray
    eps: np.ndarray
    weight_decay: np.ndarray
    nesterov: bool
    max_grad_norm: np.ndarray | None  # None: no clipping at all
    active: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-member numbers by name (no `active`, no `max_grad_norm` when None)."""
        out = {
            "lr": self.lr,
            "momentum": self.momentum,
            "beta1": self.beta1,
            "beta2": self.beta2,
            "eps": self.eps,
            "weight_decay": self.weight_decay,
        }
        if self.max_grad_norm is not None:
            out["max_grad_norm"] = self.max_grad_norm
        return out


def check_optimizer(name: object) -> str:
    """One of `OPTIMIZERS`."""
    if not isinstance(name, str) or name not in OPTIMIZERS:
        raise bad_argument("name", name, f"one of {OPTIMIZERS}")
    return name


def per_member(
    name: str,
    value: object,
    batch: int,
    *,
    below_one: bool = False,
    allow_inf: bool = False,
) -> np.ndarray:
    """`value` (a float, or ``[batch]`` numbers) as a float64 ``[batch]`` array, each >= 0.

    Args:
        name: the argument's name, for the message.
        value: a real number or an array-like of shape ``[batch]`` (lists, NumPy, torch
            and JAX arrays); bools are refused.
        batch: the member count.
        below_one: each value must also be < 1 (Adam's betas).
        allow_inf: +inf is accepted (a clipping norm that never clips).
    """
    expected = (
        f"a number or {batch} numbers (one per member), each "
        + ("in [0, 1)" if below_one else ">= 0")
        + (", +inf allowed" if allow_inf else " and finite")
    )
    if isinstance(value, (bool, np.bool_, str, bytes)) or value is None:
        raise bad_argument(name, value, expected)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise bad_argument(name, value, expected) from error
    if array.dtype == np.bool_ or array.dtype.kind not in "iuf":
        raise bad_argument(name, value, expected)
    if array.ndim == 0:
        array = np.full(batch, array, dtype=np.float64)
    if array.shape != (batch,):
        raise bad_argument(name, value, expected + f", shape ({batch},)")
    array = array.astype(np.float64)
    ok = ~np.isnan(array) & (array >= 0)
    ok &= (array < 1) if below_one else (np.isfinite(array) | (allow_inf & (array > 0)))
    if not ok.all():
        raise bad_argument(name, value, expected)
    return array


def check_active(active: object, batch: int) -> np.ndarray:
    """None (every member active) or ``[batch]`` bools, as a NumPy bool array."""
    if active is None:
        return np.ones(batch, dtype=np.bool_)
    expected = f"None or {batch} bools (one per member; False: the member does not step)"
    try:
        array = np.asarray(active)
    except (TypeError, ValueError, RuntimeError) as error:
        raise bad_argument("active", active, expected) from error
    if array.dtype != np.bool_ or array.shape != (batch,):
        raise bad_argument("active", active, expected)
    return array.copy()


def _betas(betas: object, batch: int) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise bad_argument("betas", betas, "a pair (beta1, beta2), each a number or [batch]")
    b1, b2 = betas
    return (
        per_member("betas[0]", b1, batch, below_one=True),
        per_member("betas[1]", b2, batch, below_one=True),
    )


def _check_nesterov(nesterov: bool, momentum: np.ndarray) -> None:
    if nesterov and not (momentum > 0).all():
        # torch.optim.SGD refuses the same: Nesterov needs a momentum.
        raise bad_argument("momentum", momentum, "> 0 for every member with nesterov=True")


def check_hyper(name: object, batch: object, *, lr: object, **given: object) -> MemberHyper:
    """Checks `member_optimizer`'s arguments; nothing is built before all of them pass.

    `given` holds its other keywords (momentum, betas, eps, weight_decay, nesterov,
    max_grad_norm, active); one left out takes its default (`DEFAULTS`; active: None, all).
    Keywords an optimizer does not read (momentum and nesterov for Adam/AdamW, betas and
    eps for SGD) must keep their defaults, so a misplaced value is refused, not ignored.
    """
    fields = {**DEFAULTS, "active": None}
    if not set(given) <= set(fields):  # as a signature would refuse it
        raise TypeError(f"check_hyper() got unexpected keywords {sorted(set(given) - set(fields))}")
    fields |= given
    momentum, betas, eps, nesterov = (fields[k] for k in ("momentum", "betas", "eps", "nesterov"))
    name = check_optimizer(name)
    batch = check_int("batch", batch, minimum=1)
    if not isinstance(nesterov, (bool, np.bool_)):
        raise bad_argument("nesterov", nesterov, "a bool")
    values = {
        "lr": per_member("lr", lr, batch),
        "momentum": per_member("momentum", momentum, batch),
        "eps": per_member("eps", eps, batch),
        "weight_decay": per_member("weight_decay", fields["weight_decay"], batch),
    }
    beta1, beta2 = _betas(betas, batch)
    clip = fields["max_grad_norm"]
    clip = None if clip is None else per_member("max_grad_norm", clip, batch, allow_inf=True)
    mask = check_active(fields["active"], batch)
    strays = {
        "momentum": (values["momentum"] != 0).any(),
        "nesterov": bool(nesterov),
        "betas": (beta1 != 0.9).any() or (beta2 != 0.999).any(),
        "eps": (values["eps"] != 1e-8).any(),
    }
    for key, differs in strays.items():
        if differs and key not in _OWN[name]:
            raise bad_argument(key, fields[key], f"its default {DEFAULTS[key]!r} for {name!r}")
    _check_nesterov(bool(nesterov), values["momentum"])
    return MemberHyper(
        name=name,
        batch=batch,
        beta1=beta1,
        beta2=beta2,
        nesterov=bool(nesterov),
        max_grad_norm=clip,
        active=mask,
        **values,
    )


def check_changes(hyper: MemberHyper, changes: Mapping[str, object]) -> MemberHyper:
    """`hyper` with `changes` (keywords of `set_hyper`) applied, all checked first.

    Raises:
        ArgumentError: an unknown or fixed keyword, a keyword the optimizer does not read,
            `max_grad_norm` for an optimizer built without clipping, or a bad value.
    """
    allowed = [k for k in CHANGEABLE if k in _OWN[hyper.name] or k == "active"]
    for key in changes:
        if key not in allowed:
            raise bad_argument(
                "set_hyper keyword", key, f"one of {tuple(allowed)} for {hyper.name!r}"
            )
    if "max_grad_norm" in changes and hyper.max_grad_norm is None:
        raise bad_argument(
            "max_grad_norm",
            changes["max_grad_norm"],
            "unchanged: the optimizer was built without clipping (build it with "
            "max_grad_norm=float('inf') to clip later)",
        )
    new: dict[str, Any] = {}
    batch = hyper.batch
    for key in ("lr", "momentum", "eps", "weight_decay"):
        if key in changes:
            new[key] = per_member(key, changes[key], batch)
    if "betas" in changes:
        new["beta1"], new["beta2"] = _betas(changes["betas"], batch)
    if "max_grad_norm" in changes:
        new["max_grad_norm"] = per_member(
            "max_grad_norm", changes["max_grad_norm"], batch, allow_inf=True
        )
    if "active" in changes:
        new["active"] = check_active(changes["active"], batch)
    _check_nesterov(hyper.nesterov, new.get("momentum", hyper.momentum))
    return dataclasses.replace(hyper, **new)
