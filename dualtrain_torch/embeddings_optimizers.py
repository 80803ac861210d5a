"""Which ``torch.optim`` optimizers train rows one at a time, and what each keeps per row.

An optimizer has a row-wise form when its step of a block of rows equals its step of each
row alone: its per-parameter state is made of tensors shaped like the parameter (one table
per slot) and of scalars that depend on the step count only (``step``, NAdam's
``mu_product``, ASGD's ``eta`` and ``mu``). `attach` (``dualtrain_torch.embeddings``) and the
SpeedTorch shim (``dualtrain_torch.compat.speedtorch``) share this catalogue, so they accept
and refuse the same optimizers for the same reasons. The JAX adapter's
``embeddings_optimizers`` is the same question for optax, answered on a probe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dualtrain.errors import ArgumentError

__all__ = [
    "REFUSED",
    "SPARSE_GRAD",
    "SUPPORTED",
    "as_grad",
    "check_row_wise",
    "initial_globals",
    "plain_hyper",
    "probe_state",
]

SUPPORTED = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adagrad,
    torch.optim.RMSprop,
    torch.optim.Adadelta,
    torch.optim.Rprop,
    torch.optim.ASGD,
    torch.optim.SparseAdam,
)
# Why the others have no row-wise form: their step of one row depends on other rows.
REFUSED: dict[type, str] = {
    torch.optim.LBFGS: (
        "its step is a line search over all parameters at once (a closure and flat "
        "history vectors), not an update of each row"
    ),
    torch.optim.Adafactor: (
        "it keeps factored second moments: each column's statistic sums over every row"
    ),
    torch.optim.Muon: (
        "it orthogonalises the whole update matrix, so each row's step depends on every row"
    ),
}
# Optimizers whose step takes the gradient as a sparse COO tensor (only its rows change).
SPARSE_GRAD = (torch.optim.SparseAdam,)

# State torch creates from the first gradient itself (SGD clones it into the buffer);
# on the table's first step it is left out so torch does exactly that.
FROM_FIRST_GRAD: dict[str, type] = {"momentum_buffer": torch.optim.SGD}
# Global scalars' values before step 1, from the optimizer's param group.
_INITIAL_GLOBALS: dict[str, Callable[[dict[str, Any]], float]] = {
    "mu_product": lambda group: 1.0,  # NAdam's product of momentum factors
    "eta": lambda group: float(group["lr"]),  # ASGD's step size
    "mu": lambda group: 1.0,  # ASGD's averaging factor
}
# Row slots torch creates at the first step with a value other than zero.
_INITIAL_ROWS: dict[tuple[type, str], Callable[[dict[str, Any]], float]] = {
    (torch.optim.Rprop, "step_size"): lambda group: float(group["lr"]),
}


def _is(cls: Any, family: tuple[type, ...] | type) -> bool:
    return isinstance(cls, type) and issubclass(cls, family)


def check_row_wise(optimizer: Any, name: str = "optimizer") -> type[torch.optim.Optimizer]:
    """`optimizer`, if it is a ``torch.optim`` class with a row-wise form (or a subclass).

    Raises:
        ArgumentError: naming the optimizer and why it has no row-wise form, or the list of
            those that have one.
    """
    if _is(optimizer, SUPPORTED):
        return optimizer
    label = optimizer.__name__ if isinstance(optimizer, type) else repr(optimizer)
    why = next((reason for family, reason in REFUSED.items() if _is(optimizer, family)), None)
    if why is not None:
        raise ArgumentError(f"{name}: {label} has no row-wise form: {why}")
    names = ", ".join(c.__name__ for c in SUPPORTED)
    raise ArgumentError(
        f"{name} must be a torch.optim class with a row-wise form ({names}) or a subclass; "
        f"got {label}"
    )


def as_grad(optimizer: Any, grad: torch.Tensor) -> torch.Tensor:
    """`grad` of a block of rows as `optimizer` takes it: sparse COO for SparseAdam.

    Every row of the block is in the sparse gradient, as every looked-up row is in the
    gradient of a sparse ``nn.Embedding``: SparseAdam updates each of them.
    """
    if not isinstance(optimizer, SPARSE_GRAD) or grad.is_sparse:
        return grad
    rows = torch.arange(grad.shape[0], device=grad.device).unsqueeze(0)
    return torch.sparse_coo_tensor(
        rows, grad, grad.shape, is_coalesced=True, check_invariants=False
    )


def plain_hyper(hyper: dict[str, Any]) -> dict[str, Any]:
    """`hyper` for a small CPU twin of the optimizer (no fused or foreach kernels)."""
    return {k: v for k, v in hyper.items() if k not in ("fused", "foreach")}


def probe_state(
    optimizer: type[torch.optim.Optimizer], hyper: dict[str, Any], dim: int, dtype: torch.dtype
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What `optimizer` keeps per parameter, found by stepping a small twin once.

    Returns:
        The row slots with each one's initial row ([dim], `dtype`; zeros unless torch sets
        it otherwise, as Adagrad's ``initial_accumulator_value`` or Rprop's ``step_size``),
        and the global (scalar) entries such as ``step`` after one step: their types are
        the ones torch keeps (a Python int for SparseAdam's ``step``).
    """
    param = torch.nn.Parameter(torch.zeros(2, dim, dtype=torch.float64))
    opt = optimizer([param], **plain_hyper(hyper))
    group = opt.param_groups[0]
    initial = {k: v.clone() for k, v in opt.state[param].items() if torch.is_tensor(v)}
    param.grad = as_grad(opt, torch.ones_like(param))
    opt.step()
    slots, globals_ = {}, {}
    for name, value in opt.state[param].items():
        if torch.is_tensor(value) and value.shape == param.shape:
            if name in initial:
                row = initial[name][0]
            else:
                fill = next(
                    (f for (c, n), f in _INITIAL_ROWS.items() if n == name and _is(optimizer, c)),
                    None,
                )
                row = torch.zeros(dim) if fill is None else torch.full((dim,), fill(group))
            slots[name] = row.to(dtype)
        else:
            globals_[name] = value
    return slots, globals_


def initial_globals(names: Any, group: dict[str, Any]) -> dict[str, float]:
    """The values before step 1 of the global scalars among `names` other than ``step``."""
    return {k: f(group) for k, f in _INITIAL_GLOBALS.items() if k in names}
