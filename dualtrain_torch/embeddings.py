"""Training an EmbeddingStore's rows with a real ``torch.optim`` optimizer.

Per step only the batch's unique rows, and their rows of every optimizer-state table, are
staged; they are handed to the user's optimizer as one parameter of [U, dim] with its
state filled in, ``optimizer.step()`` runs torch's own code on them, and they go back.
Every supported optimizer is element-wise, so stepping the rows a batch touches is the
same arithmetic as stepping those rows of the full table.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from dualtrain import convert
from dualtrain.embeddings import Attachment, EmbeddingStore, RowSession, ShardedAttachment
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_torch.embeddings_optimizers import (
    FROM_FIRST_GRAD,
    SUPPORTED,
    as_grad,
    check_row_wise,
    initial_globals,
    plain_hyper,
    probe_state,
)
from dualtrain_torch.transfer import Transfer, parse_device

__all__ = ["SUPPORTED", "ShardedTorchRows", "TorchRows", "attach", "pinned_empty", "probe_state"]

# Kept under their old names: they moved to `dualtrain_torch.embeddings_optimizers`.
_FROM_FIRST_GRAD = FROM_FIRST_GRAD


def pinned_empty(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A host ndarray in page-locked memory allocated by torch (needs CUDA)."""
    tensor = torch.empty(shape, dtype=getattr(torch, dtype), pin_memory=True)
    return convert(tensor, to="numpy")


def attach(
    store: EmbeddingStore,
    optimizer: type[torch.optim.Optimizer],
    mode: str = "lazy",
    device: Any = None,
    **hyper: Any,
) -> TorchRows | ShardedTorchRows:
    """Trains `store` with ``optimizer(params, **hyper)``, one batch of rows at a time.

    Args:
        store: the rows and (after this call) their optimizer-state tables.
        optimizer: a ``torch.optim`` class among `SUPPORTED` (or a subclass of one).
        mode: "lazy" (rows and state change only when touched) or "exact" (touched rows
            first take the zero-gradient steps they missed: equal to dense training).
        device: where rows are updated ("cpu", "cuda", "cuda:N", a torch.device); default
            "cuda" for a pinned store, else "cpu".
        hyper: the optimizer's keyword arguments (lr, betas, momentum, ...). Where torch
            offers a fused kernel for the device and neither `fused` nor `foreach` is given,
            the fused one is used.

    Returns:
        A `TorchRows`: ``emb = rows.fetch(ids)``; ``loss.backward()``; ``rows.step()``. For
        a store sharded by ``mv.sync(store)``, a `ShardedTorchRows` with the same calls:
        each row's gradient is summed over the processes and stepped once by its owner.
    """
    rows = TorchRows(store, optimizer, mode, device, hyper)
    return rows if store.shard is None else ShardedTorchRows(rows, store.shard)


class TorchRows(Attachment):
    """A store attached to a torch optimizer (see `attach`).

    Attributes:
        store: the EmbeddingStore.
        optimizer: the real ``torch.optim`` instance; it sees one parameter, the staged
            rows, so LR schedulers work on it as usual.
        param: that parameter ([U, dim] during a step).
        mode: "lazy" or "exact".
        transfer: the `dualtrain_torch.transfer.Transfer` that takes rows to `device`.
    """

    def __init__(
        self,
        store: EmbeddingStore,
        optimizer: Any,
        mode: str,
        device: Any,
        hyper: dict[str, Any],
    ) -> None:
        optimizer = check_row_wise(optimizer)
        if mode == "exact" and issubclass(optimizer, torch.optim.SparseAdam):
            raise bad_argument(
                "mode",
                mode,
                '"lazy" for SparseAdam: it updates only the rows in the gradient by '
                "definition (use Adam for exact, dense-equivalent training)",
            )
        if not isinstance(store, EmbeddingStore):
            raise bad_argument("store", type(store).__name__, "a dualtrain.EmbeddingStore")
        # Rows reach the device through the adapter's one Transfer (a bad device fails here).
        self.device = parse_device(
            device if device is not None else ("cuda" if store.pinned else "cpu")
        )
        self.transfer = Transfer(self.device)
        self.dtype = getattr(torch, store.dtype)
        hyper = dict(hyper)
        params = inspect.signature(optimizer.__init__).parameters
        if "fused" in params and "fused" not in hyper and "foreach" not in hyper:
            hyper["fused"] = self.dtype in (
                torch.float32,
                torch.float64,
                torch.float16,
                torch.bfloat16,
            )
        self.param = torch.nn.Parameter(
            torch.zeros(0, store.dim, dtype=self.dtype, device=self.device)
        )
        self.optimizer = optimizer([self.param], **hyper)
        self._cls, self._hyper = optimizer, hyper
        init, self._globals = probe_state(optimizer, hyper, store.dim, self.dtype)
        first = initial_globals(self._globals, self.optimizer.param_groups[0])
        self._history: dict[str, list[float]] = {k: [v] for k, v in first.items()}
        self._clock: tuple[torch.nn.Parameter, torch.optim.Optimizer] | None = None
        self.slots = list(init)
        self._idle_identity = self._is_identity(store.dim, init, fresh=False)
        self._fresh_identity = self._is_identity(store.dim, init, fresh=True)
        self.session = RowSession(store, {k: convert(v, to="numpy") for k, v in init.items()}, mode)
        self.store, self.mode = store, mode
        self._rows: dict[str, torch.Tensor] = {}
        self._staged: dict[str, torch.Tensor] = {}

    # ---- what the optimizer keeps ----------------------------------------------------

    def _is_identity(self, dim: int, init: dict[str, torch.Tensor], fresh: bool) -> bool:
        """Whether a zero-gradient step leaves rows and state unchanged.

        From the initial state when `fresh`, else from any state; then exact mode need not
        replay it.
        """
        gen = torch.Generator().manual_seed(0)
        rows = torch.randn(3, dim, generator=gen, dtype=self.dtype)
        state = {
            k: (v.expand(3, dim) if fresh else torch.rand(3, dim, generator=gen) + 0.5)
            .to(self.dtype)
            .clone()
            for k, v in init.items()
        }
        before = {"weight": rows.clone(), **{k: v.clone() for k, v in state.items()}}
        after = self._apply(
            rows.to(self.device),
            torch.zeros_like(rows, device=self.device),
            {k: v.to(self.device) for k, v in state.items()},
            tau=2,
        )
        return all(torch.equal(before[k], after[k].cpu()) for k in before)

    def _global_state(self, steps: int) -> dict[str, Any]:
        """Global state as it stands after `steps` steps of the whole table."""
        on_device = self._hyper.get("fused") or self._hyper.get("capturable")
        where = self.device if on_device else torch.device("cpu")
        state: dict[str, Any] = {"step": steps}  # SparseAdam counts in a Python int
        if torch.is_tensor(self._globals.get("step")):
            state["step"] = torch.tensor(float(steps), dtype=torch.float32, device=where)
        history = self._history
        # One twin step records every global at once (stepping it per name would advance
        # the twin once for each: ASGD's mu then ran ahead of its eta and of the rows).
        while history and len(next(iter(history.values()))) <= steps:
            for name, value in self._tick().items():
                history[name].append(value)
        for name, values in history.items():
            state[name] = torch.tensor(values[steps], dtype=torch.float32, device=where)
        return state

    def _tick(self) -> dict[str, float]:
        """One zero-gradient step of a one-value twin: the next value of every global."""
        if self._clock is None:
            param = torch.nn.Parameter(torch.zeros(1, 1))
            self._clock = (param, self._cls([param], **plain_hyper(self._hyper)))
        param, opt = self._clock
        param.grad = torch.zeros_like(param)
        opt.step()
        return {name: float(opt.state[param][name]) for name in self._history}

    def _apply(
        self, rows: torch.Tensor, grad: torch.Tensor, slots: dict[str, torch.Tensor], tau: int
    ) -> dict[str, torch.Tensor]:
        """Global step `tau` (1-based) of the real optimizer on `rows` and their state."""
        param = self._bind(rows)
        param.grad = as_grad(self.optimizer, grad)
        state = self.optimizer.state[param]
        state.update(self._global_state(tau - 1))
        for name, value in slots.items():
            if not (tau == 1 and isinstance(self.optimizer, _FROM_FIRST_GRAD.get(name, ()))):
                state[name] = value
        self.optimizer.step()
        return {"weight": param.data, **{name: state[name] for name in slots}}

    def _bind(self, rows: torch.Tensor) -> torch.nn.Parameter:
        """A fresh parameter sharing `rows`, made the optimizer's only one.

        Autograd caches a leaf's shape, so a parameter is never reused for a batch of another
        size.
        """
        self.param = torch.nn.Parameter(rows)
        self.optimizer.param_groups[0]["params"] = [self.param]
        self.optimizer.state.clear()
        return self.param

    # ---- the step ----------------------------------------------------------------------

    def fetch(self, *ids: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The rows of `ids` as a differentiable tensor [*ids.shape, dim] on the device.

        Several id arrays share one gather (and one update): ``a, b = rows.fetch(x, y)``.
        Each unique row is gathered once; the gradients of repeated ids add up.
        """
        batch = self.session.begin(ids)
        n = batch.size
        self._staged = {k: convert(v[:n], to="torch") for k, v in batch.rows.items()}
        # The session's own staging buffers (pinned on CUDA) go as they are, not restaged:
        # the session orders their reuse after this step's write-back (a CUDA event).
        self._rows = {k: self.transfer.put(v) for k, v in self._staged.items()}
        # Exact mode: rows take the steps they missed before the forward pass sees them.
        self._catch_up(batch, self._rows["weight"], {k: self._rows[k] for k in self.slots})
        self._bind(self._rows["weight"])
        inverse = self.transfer.put(torch.from_numpy(batch.lookup.inverse))
        gathered = torch.index_select(self.param, 0, inverse)
        out, start = [], 0
        for shape in batch.lookup.shapes:
            count = int(np.prod(shape, dtype=np.int64))
            out.append(gathered[start : start + count].view(*shape, self.store.dim))
            start += count
        return out[0] if len(out) == 1 else tuple(out)

    def step(self) -> None:
        """Updates the fetched rows and their state with the optimizer; writes both back.

        Nothing is written back when this raises; fetch the batch again to retry.
        """
        batch = self.session.require_current()
        grad = self.param.grad
        try:
            if grad is None:
                raise ArgumentError("step() found no gradient: call loss.backward() after fetch")
            slots = {k: self._rows[k] for k in self.slots}
            out = self._apply(self._rows["weight"], grad, slots, self.session.t + 1)
        except BaseException:
            self.session.abandon()
            raise
        self._write_back(batch, out, advance=True)

    def _write_back(self, batch: Any, out: dict[str, torch.Tensor], advance: bool) -> None:
        for name, value in out.items():
            staged = self._staged[name]
            if value.data_ptr() != staged.data_ptr():
                staged.copy_(value, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        before = None if event is None else event.synchronize
        self.session.finish(batch, batch.rows, before, advance)

    def settle(self) -> None:
        """Exact mode: brings every row up to the current step.

        Each row replays the steps it missed, so the table equals dense training's now; a
        no-op in lazy mode.
        """
        with self.session.owned():  # one unit: no thread steps in between
            if self._idle_identity:
                return
            for ids in self.session.stale(self._fresh_identity):
                self.fetch(ids)  # catches the rows up
                batch = self.session.require_current()
                slots = {k: self._rows[k] for k in self.slots}
                self._write_back(batch, {"weight": self._rows["weight"], **slots}, advance=False)

    def _catch_up(self, batch: Any, rows: torch.Tensor, slots: dict[str, torch.Tensor]) -> None:
        """Exact mode: replays each row's missed zero-gradient steps through the optimizer."""
        if self._idle_identity:
            return
        taus, last = self.session.missed(batch, self._fresh_identity)
        if not taus:
            return
        last_t = self.transfer.put(torch.from_numpy(last))
        zeros = torch.zeros_like(rows)
        for tau in taus:
            active = (last_t < tau)[:, None]
            saved = {"weight": rows.clone(), **{k: v.clone() for k, v in slots.items()}}
            out = self._apply(rows, zeros, slots, tau)
            rows.copy_(torch.where(active, out["weight"], saved["weight"]))
            for name in slots:
                slots[name].copy_(torch.where(active, out[name], saved[name]))

    def zero_grad(self) -> None:
        """Clears the rows' gradient (fetch clears it too)."""
        self.param.grad = None

    @property
    def hyper(self) -> dict[str, Any]:
        """The optimizer's hyper-parameters (its param group without the params)."""
        group = self.optimizer.param_groups[0]
        return {k: v for k, v in group.items() if k != "params"}


class ShardedTorchRows(ShardedAttachment):
    """A shard attached to a torch optimizer (see `attach` and `ShardedAttachment`).

    ``fetch`` takes ids of the whole table and returns their rows from their owners;
    after ``loss.backward()``, ``step()`` has each owner step its rows once with the sum
    of every process's gradient. ``fetch``, ``prefetch`` and ``step`` are collectives.

    Attributes:
        local: the `TorchRows` training this process's rows.
        param: the fetched rows as one leaf [U, dim] (U: the batch's unique ids).
    """

    def __init__(self, local: TorchRows, shard: Any) -> None:
        super().__init__(local, shard)
        self.param = torch.nn.Parameter(torch.zeros(0, local.store.dim, dtype=local.dtype))
        self._served: torch.Tensor | None = None

    def fetch(self, *ids: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The rows of `ids` (ids of the whole table), differentiable, [*ids.shape, dim]."""
        found, rows = self.exchange_rows(ids)
        local = self.local
        # convert, not torch.from_numpy: a bfloat16 table's rows are ml_dtypes arrays
        self.param = torch.nn.Parameter(local.transfer.put(convert(rows, to="torch")))
        inverse = local.transfer.put(torch.from_numpy(found.inverse))
        gathered = torch.index_select(self.param, 0, inverse)
        out, start = [], 0
        for shape in found.shapes:
            count = int(np.prod(shape, dtype=np.int64))
            out.append(gathered[start : start + count].view(*shape, self.store.dim))
            start += count
        return out[0] if len(out) == 1 else tuple(out)

    def fetch_local(self, union: np.ndarray) -> np.ndarray:
        served = self.local.fetch(union)
        assert isinstance(served, torch.Tensor)
        self._served = served
        return convert(served.detach(), to="numpy")

    def step(self) -> None:
        """Steps every fetched row once, with its gradient summed over the processes."""
        self.require_route()  # this thread's batch, before any exchange
        grad = self.param.grad
        if grad is None and len(self.param) == 0:
            grad = torch.zeros_like(self.param)  # no rows in this process's batch
        if grad is None:
            self.release()
            raise ArgumentError("step() found no gradient: call loss.backward() after fetch")
        self.step_rows(convert(grad.detach(), to="numpy"))

    def step_local(self, summed: np.ndarray) -> None:
        served, self._served = self._served, None
        assert served is not None
        local = self.local
        grad = local.transfer.put(convert(summed, to="torch")).to(served.dtype)
        served.backward(grad)
        local.step()

    def zero_grad(self) -> None:
        """Clears the fetched rows' gradient (fetch starts a new leaf anyway)."""
        self.param.grad = None

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The real ``torch.optim`` instance stepping this process's rows."""
        return self.local.optimizer

    @property
    def hyper(self) -> dict[str, Any]:
        """The optimizer's hyper-parameters (its param group without the params)."""
        return self.local.hyper
