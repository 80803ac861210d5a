"""`DistributedLearner`: one DDP training step whose loss is the global batch's mean.

Each process runs its own rows through the synced (DDP) model. Before the backward, one
``all_reduce`` sums every process's loss sum and row count (rows its mask marks True); each
process then back-propagates ``nworld * local_sum / global_count``, which DDP's gradient
averaging turns into the gradient of the global mean. So one step on N processes equals one
single-process step on their rows together, even when processes hold different numbers of
(valid) rows: a short last batch is padded and masked, never a hang. A world of one runs
the plain loop's step: no collective, no rescaling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dualtrain.errors import bad_argument
from dualtrain_torch.distributed_exit import handed
from dualtrain_torch.distributed_rows import count_rows, local_loss, to_device

if TYPE_CHECKING:
    from dualtrain_torch.distributed import TorchRuntime

__all__ = ["DistributedLearner"]


class DistributedLearner:
    """One data-parallel training step: ``loss = learner.step(inputs, targets, mask=None)``.

    The loss and the gradient are those of the mean over the GLOBAL batch, every process's
    rows (with `mask`, the rows it marks True over every process), so one step on N
    processes with b rows each equals one single-process step on the N*b rows, even when
    the processes hold different numbers of (valid) rows.

    Attributes:
        model: the synced model (a `SyncedModule`); `optimizer`, `loss_fn` as given.
        steps: steps taken.
    """

    def __init__(
        self, runtime: TorchRuntime, model: Any, optimizer: Any, loss_fn: Callable[..., Any] | None
    ) -> None:
        self.runtime, self.model, self.optimizer = runtime, model, optimizer
        self.loss_fn = _per_sample_cross_entropy if loss_fn is None else loss_fn
        self.steps = 0

    def step(self, inputs: Any, targets: Any, mask: Any = None) -> torch.Tensor:
        """Zero the gradients, forward, loss, backward (all-reduced), optimizer step.

        Args:
            inputs: a tensor (B, ...) or a tuple of them (the model's positional inputs).
            targets: what `loss_fn` takes with the outputs (default: class ids (B,)).
            mask: optional bool (B,): the rows that count (pad-and-mask for a short batch);
                needs a `loss_fn` returning per-sample losses (B,).

        Returns:
            The global mean loss, a 0-d tensor (detached), the same on every process.
        """
        if not getattr(self.model, "require_backward_grad_sync", True):
            # Inside DDP's no_sync the backward reduces nothing, yet the step would apply
            # each process's own gradient: the replicas would part for good, silently.
            raise bad_argument(
                "learner.model", "inside no_sync()", "outside mv.no_sync(...): a learner "
                "step reduces and applies the gradient at once (accumulate micro-batches by "
                "hand, or pass a larger batch)"
            )  # fmt: skip
        device = self.runtime.device
        inputs = tuple(
            to_device(x, device) for x in (inputs if isinstance(inputs, tuple) else (inputs,))
        )
        targets = to_device(targets, device)
        if self.runtime.nworld == 1:
            return self._alone(inputs, targets, mask)
        comm = self.runtime.comm_device
        with self.runtime.counted_step():
            # The rows that count are known before the forward: their global number is
            # summed while the forward runs (a blocking collective here cost 10-20% a step).
            counted = count_rows(inputs, mask, device).to(comm)
            handed(counted)
            counting = dist.all_reduce(counted, async_op=True)
            self.optimizer.zero_grad(set_to_none=True)
            losses = self.loss_fn(self.model(*inputs), targets)
            local_sum, _ = local_loss(losses, inputs, mask)
            counting.wait()
            total = counted[0].to(local_sum.device).clamp(min=1)
            # DDP averages over the N processes: N * local_sum / global_count averages to
            # the global mean's gradient.
            (local_sum * (self.runtime.nworld / total).to(local_sum.dtype)).backward()
            summed = local_sum.detach().double().reshape(1).to(comm)
            handed(summed)
            summing = dist.all_reduce(summed, async_op=True)
            self.optimizer.step()  # while the loss is summed
            summing.wait()
            self.steps += 1
        return (summed.to(local_sum.device).reshape(()) / total).to(local_sum.dtype)

    def _alone(self, inputs: tuple[Any, ...], targets: Any, mask: Any) -> torch.Tensor:
        """A world of one's step: the plain loop's, with no collective and no rescaling.

        The loss is what several processes compute: the sum of the per-row losses over
        the rows that count (a mask's True rows; none: a zero loss). The default loss on
        class ids ``(B,)`` takes it in one kernel, ``F.cross_entropy(reduction="sum")``
        over B (an ignored target counts as a row of loss 0, as it does per row).
        """
        with self.runtime.counted_step():
            self.optimizer.zero_grad(set_to_none=True)
            outputs = self.model(*inputs)
            if (
                self.loss_fn is _per_sample_cross_entropy and mask is None
                and isinstance(targets, torch.Tensor) and isinstance(outputs, torch.Tensor)
                and targets.ndim == 1 and outputs.ndim == 2 and targets.shape[0]
            ):  # fmt: skip
                summed = torch.nn.functional.cross_entropy(outputs, targets, reduction="sum")
                loss = summed / targets.shape[0]
            else:
                local_sum, count = local_loss(self.loss_fn(outputs, targets), inputs, mask)
                loss = local_sum / count.to(local_sum.dtype).clamp(min=1)
            loss.backward()
            self.optimizer.step()
            self.steps += 1
        return loss.detach()


def _per_sample_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(outputs, targets, reduction="none")
