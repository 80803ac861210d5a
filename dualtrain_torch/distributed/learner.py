"""`DistributedLearner`: one DDP training step whose loss is the global batch's mean.

Each process runs its own rows through the synced (DDP) model and back-propagates the sum
of its rows' losses. The rows that count (a mask's True rows) and that loss sum ride in
DDP's first gradient bucket (a communication hook appends them), so the step's only
collectives are DDP's own bucket all-reduces, as in DDP by hand; the hook divides each
summed bucket by the global row count, which makes the gradient that of the global mean.
So one step on N processes equals one single-process step on their rows together, even
when processes hold different numbers of (valid) rows: a short last batch is padded and
masked, never a hang. A world of one runs the plain loop's step: no collective, no
rescaling.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from dualtrain.errors import bad_argument
from dualtrain_torch.distributed.exit import handed
from dualtrain_torch.distributed.rows import Joined, count_rows, local_loss, to_device

__all__ = ["DistributedLearner", "carries_rows"]


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
        self, runtime: Joined, model: Any, optimizer: Any, loss_fn: Callable[..., Any] | None
    ) -> None:
        self.runtime, self.model, self.optimizer = runtime, model, optimizer
        self.loss_fn = _per_sample_cross_entropy if loss_fn is None else loss_fn
        self.steps = 0
        # Registered at the first step, so a comm hook of the user's made after the
        # learner still comes first (DDP takes one).
        self._riders: _Riders | None = None
        self._hooked = runtime.nworld == 1

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
        if not self._hooked:
            self._riders, self._hooked = _riders_on(self.model), True
        riders = self._riders
        if riders is None:
            return self._with_collectives(inputs, targets, mask)
        with self.runtime.counted_step():
            self.optimizer.zero_grad(set_to_none=True)
            losses = self.loss_fn(self.model(*inputs), targets)
            local_sum, count = local_loss(losses, inputs, mask)
            riders.carry(count, local_sum)
            try:
                local_sum.backward()  # the hook divides the summed buckets by the global rows
                totals = riders.totals()
            finally:
                riders.clear()
            self.optimizer.step()
            self.steps += 1
        rows, loss_sum = totals.to(local_sum.device).unbind()
        return (loss_sum / rows.clamp(min=1)).to(local_sum.dtype)

    def _with_collectives(self, inputs: tuple[Any, ...], targets: Any, mask: Any) -> torch.Tensor:
        """The step for a model whose gradient buckets cannot carry the rows.

        (Another comm hook registered on it, or parameters in a half type): two scalar
        all-reduces more than DDP's, the rows' before the backward and the loss's after it.
        """
        comm = self.runtime.comm_device
        group = getattr(self.model, "process_group", None)  # the DDP's (None: the default)
        replicas = dist.get_world_size(group)
        with self.runtime.counted_step():
            # The rows that count are known before the forward: their global number is
            # summed while the forward runs (a blocking collective here cost 10-20% a step).
            counted = count_rows(inputs, mask, self.runtime.device).to(comm)
            handed(counted)
            counting = dist.all_reduce(counted, group=group, async_op=True)
            self.optimizer.zero_grad(set_to_none=True)
            losses = self.loss_fn(self.model(*inputs), targets)
            local_sum, _ = local_loss(losses, inputs, mask)
            counting.wait()
            total = counted[0].to(local_sum.device).clamp(min=1)
            # DDP averages over its N replicas: N * local_sum / global_count averages to
            # the global mean's gradient.
            (local_sum * (replicas / total).to(local_sum.dtype)).backward()
            summed = local_sum.detach().double().reshape(1).to(comm)
            handed(summed)
            summing = dist.all_reduce(summed, group=group, async_op=True)
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


class _Riders:
    """The state of a learner's comm hook on one DDP: what rides in its first bucket.

    During a learner's backward, `carried` is this process's (rows that count, loss sum);
    the first bucket's all-reduce sums them with the gradients, and every bucket's summed
    gradients are divided by the global rows. Outside a learner's step (a loop written by
    hand on the same model) the hook is DDP's own: the mean over the processes.
    """

    def __init__(self, group: Any) -> None:
        self.group = group  # the DDP's process group (None: the default one)
        self.carried: torch.Tensor | None = None  # (2,) this process's rows and loss sum
        self.first: torch.futures.Future[torch.Tensor] | None = None  # bucket 0, reduced
        self.summed: torch.Tensor | None = None  # (2,) rows and loss sum over the processes

    def carry(self, rows: torch.Tensor, loss_sum: torch.Tensor) -> None:
        # float64 here, the bucket's float32/64 on the wire: a half-type loss (autocast)
        # would round the row count (257 rows are 256 in bfloat16)
        self.carried = torch.stack([rows.double(), loss_sum.detach().double()])

    def totals(self) -> torch.Tensor:
        """The global (rows, loss sum), once the backward (which waits for every bucket) ran."""
        if self.summed is None:
            raise RuntimeError(
                "DDP reduced no gradient bucket in this backward (a model without a "
                "gradient this step?): its processes cannot agree on a step"
            )
        return self.summed

    def clear(self) -> None:
        self.carried = self.first = self.summed = None


# The hooks registered, one per DDP: a model two learners share carries its rows once.
_registered: weakref.WeakKeyDictionary[DistributedDataParallel, _Riders] = (
    weakref.WeakKeyDictionary()
)
_RIDING_DTYPES = (torch.float32, torch.float64)  # a row count stays exact in these


def carries_rows(model: Any) -> bool:
    """Whether a learner's comm hook is registered on `model` (a DDP takes one hook)."""
    return model in _registered


def _riders_on(model: Any) -> _Riders | None:
    """The hook state of `model`'s DDP, its hook registered at first use.

    None where the rows cannot ride in its buckets: not a DDP, a half-type parameter, or
    a comm hook of the user's.
    """
    if not isinstance(model, DistributedDataParallel):
        return None
    if model in _registered:
        return _registered[model]
    if any(p.dtype not in _RIDING_DTYPES for p in model.parameters() if p.requires_grad):
        return None
    if any(_sparse_gradient(m) for m in model.module.modules()):
        return None  # a sparse gradient's bucket holds no dense tail to carry the rows
    if getattr(model, "_comm_hooks", None):
        return None  # the user registered a comm hook of their own: theirs stays
    riders = _Riders(getattr(model, "process_group", None))
    try:
        model.register_comm_hook(riders, _rows_in_first_bucket)
    except RuntimeError:  # a hook registered another way (a built-in one): it stays
        return None
    _registered[model] = riders
    return riders


def _sparse_gradient(module: torch.nn.Module) -> bool:
    # What DDP itself reads to expect a sparse gradient (a bucket of its own).
    embeddings = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return isinstance(module, embeddings) and module.sparse and module.weight.requires_grad


def _rows_in_first_bucket(riders, bucket):
    # No annotations: DDP compares them with its own classes, and this module's are strings.
    carried = riders.carried
    if carried is None:  # a backward outside a learner step: DDP's own mean
        return allreduce_hook(riders.group, bucket)
    grads = bucket.buffer()
    if bucket.index() == 0:  # DDP launches bucket 0 first: the rows ride with it
        wire = torch.cat([grads, carried.to(grads.device, grads.dtype)])
        handed(wire)

        def unpack(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            summed = done.value()[0]
            riders.summed = summed[-2:].clone()
            return grads.copy_(summed[:-2]).div_(summed[-2].clamp(min=1))

        reducing = dist.all_reduce(wire, group=riders.group, async_op=True)
        riders.first = reducing.get_future().then(unpack)
        return riders.first
    first = riders.first
    if first is None:
        raise RuntimeError("DDP reduced a later gradient bucket before its first")
    reduced = dist.all_reduce(grads, group=riders.group, async_op=True).get_future()

    def scale(_: torch.futures.Future[Any]) -> torch.Tensor:
        return grads.div_(riders.summed[0].clamp(min=1))

    return torch.futures.collect_all([first, reduced]).then(scale)
