"""The rows of a torch batch in a data-parallel step: which count, and the loss they carry.

The JAX adapter's ``distributed.rows`` has the same role for its learner. `Joined` is what
the learner and the collectives use of the run (`TorchRuntime` meets it): they annotate
against it, not against the runtime's class, which imports them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np
import torch

from dualtrain.errors import ShapeError, bad_argument
from dualtrain.multiverse.seams import Runtime

__all__ = ["Joined", "count_rows", "local_loss", "to_device"]


class Joined(Runtime, Protocol):
    """A `Runtime` over torch: one replica a process, on `device`.

    Attributes:
        device: where this process's replica lives.
    """

    device: torch.device

    @property
    def comm_device(self) -> torch.device:
        """Where collectives' tensors live."""
        ...

    def counted_step(self) -> AbstractContextManager[None]:
        """One training step: synced forwards inside are not counted, the step is, once."""
        ...


def local_loss(losses: Any, inputs: tuple[Any, ...], mask: Any) -> tuple[Any, Any]:
    """This process's loss sum and the rows it counts (a mask's True rows), on its device."""
    if not isinstance(losses, torch.Tensor) or losses.ndim > 1:
        raise ShapeError(
            f"loss_fn must return per-sample losses (B,) or a 0-d mean; got "
            f"{getattr(losses, 'shape', type(losses).__name__)}"
        )
    if losses.ndim == 0:
        if mask is not None:
            raise bad_argument("mask", "given", "None when loss_fn returns a 0-d mean")
        rows = len(inputs[0]) if inputs and isinstance(inputs[0], torch.Tensor) else 1
        if rows == 0:  # the mean of no rows is NaN: it would make the global mean NaN
            losses = losses.nan_to_num(0.0)  # still in the graph: DDP's hooks must fire
        return losses * rows, torch.tensor(float(rows), device=losses.device)
    if mask is None:
        return losses.sum(), torch.tensor(float(losses.shape[0]), device=losses.device)
    mask = to_device(mask, losses.device)
    if mask.dtype != torch.bool or tuple(mask.shape) != tuple(losses.shape):
        raise ShapeError(
            f"mask must be bool of the losses' shape {tuple(losses.shape)}; got "
            f"mask of {mask.dtype} {tuple(mask.shape)}"
        )
    return torch.where(mask, losses, 0).sum(), mask.sum()


def count_rows(inputs: tuple[Any, ...], mask: Any, device: torch.device) -> torch.Tensor:
    """The rows that count, as a float64 (1,): the mask's True entries, else the batch's rows."""
    if mask is not None:
        rows = (
            to_device(mask, device).sum() if isinstance(mask, (torch.Tensor, np.ndarray)) else None
        )
        if rows is None:
            rows = torch.as_tensor(mask, device=device).sum()
        return rows.double().reshape(1)
    first = inputs[0] if inputs else None
    rows = len(first) if isinstance(first, torch.Tensor) and first.ndim else 1
    return torch.tensor([float(rows)], dtype=torch.float64, device=device)


def to_device(x: Any, device: torch.device) -> Any:
    """A tensor or NumPy value on `device` (asynchronously where it can); others as given."""
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, (np.ndarray, np.generic)):
        return torch.as_tensor(x, device=device)
    return x
