"""torchmb's `BatchModule` (``torchmb.batch``): `batch` copies of a model run as one module.

Kept: ``BatchModule(model, batch)`` with every member a copy of `model`'s weights;
``forward(*x, merge=True, split=True, data_order='g b')`` on ``[G, B, ...]`` inputs;
``state_dict()`` under the model's own keys (``[G, ...]`` tensors); ``load_state_dicts`` /
``state_dicts`` to move members in and out. Different underneath: no ``torch.fx`` rewrite and
no per-layer registry are needed (``torch.func`` runs any module, so Conv1d, LayerNorm,
grouped convs, padding modes and ``x.mean(0)`` are right), no B*G copies of the weights, and
an isolation probe on the first call. A registered batch module is a fast path, checked
against the generic one before it is used (docs/batching.md, "Migrating from torchmb").
torchmb's ``BatcherTracer`` (its ``torch.fx`` tracer) has no counterpart: asking for it
raises `MovedNameError` saying so.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from dualtrain.batching import members
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_torch.batching import BatchModule as NativeBatchModule
from dualtrain_torch.batching.members import Stack, copy_module
from dualtrain_torch.compat.torchmb import fast
from dualtrain_torch.compat.torchmb.base import AbstractBatchModule
from dualtrain_torch.compat.torchmb.functional import (
    from_members,
    merge_batch,
    split_batch,
    to_members,
)
from dualtrain_torch.compat.torchmb.moved import moved_names
from dualtrain_torch.compat.torchmb.types import DataOrder
from dualtrain_torch.compat.torchmb.utils import to_batch_func, to_batch_module

# AbstractBatchModule, merge_batch and split_batch: torchmb's tests import them from here.
__all__ = ["AbstractBatchModule", "BatchModule", "merge_batch", "split_batch"]

__getattr__ = moved_names(
    __name__,
    {
        "BatcherTracer": (
            "dualtrain traces nothing: BatchModule(model, batch) runs the model as written, "
            "per member through torch.func, and registered batch modules "
            "(register_batch_module) stand in for their base class's modules"
        )
    },
)


class _Run:
    """What the first call settles (kept off the module's attributes: those may be layers)."""

    def __init__(self) -> None:
        self.checked: str | None = None


class BatchModule(AbstractBatchModule):
    """`batch` copies of `model`, run as one module (torchmb's ``BatchModule``).

    Every member starts with `model`'s weights (torchmb's semantics; the native
    `dualtrain_torch.BatchModule` draws members independently). The parameters are
    ``[batch, ...]`` tensors under `model`'s own names, so ``bm.state_dict()`` and
    ``bm.named_parameters()`` read as torchmb's do, and one optimizer steps every member.

    Args:
        model: any ``nn.Module``; copied, never changed.
        batch: G, the member count.
        inplace: accepted for torchmb's signature; the model is never changed either way.
        replace_func: accepted for torchmb's signature (which never used it); must be None.
        strategy: the native strategy (``"auto"`` measures vmap, chunked and loop).
        check_isolation: probe on the first call that no member moves another.

    Raises:
        ArgumentError: a bad argument. RegisteredModuleError: a registered batch module that
            does not hold the model's tensors as ``[batch, ...]``, or (on the first call)
            disagrees with the generic path.
    """

    # Plain attributes, set through __dict__: not submodules of this one.
    _native: NativeBatchModule | None
    _template: nn.Module
    _pieces: list[fast.Piece] | None
    _run: _Run
    _stack: nn.Module

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        hooks = [n for n in ("to_batch_func", "to_batch_module") if n in cls.__dict__]
        if hooks:
            # torchmb's rewrite called them per graph node; nothing here would: refuse, not ignore.
            raise ArgumentError(
                f"{cls.__name__} overrides {hooks}, the hooks torchmb's torch.fx rewrite called "
                "per node; dualtrain rewrites nothing and would never call them. Register a "
                "batch module for the layer instead (register_batch_module), or write the "
                "function into the model: every member runs it on its own rows"
            )

    def __init__(
        self,
        model: nn.Module,
        batch: int = 1,
        inplace: bool = True,
        replace_func: Any = None,
        *,
        strategy: str = "auto",
        check_isolation: bool = True,
    ) -> None:
        super().__init__(batch)
        if not isinstance(model, nn.Module):
            raise bad_argument("model", model, "a torch nn.Module")
        members.check_flag("inplace", inplace)
        members.check_strategy(strategy, "torch")
        members.check_flag("check_isolation", check_isolation)
        if replace_func is not None:
            raise bad_argument("replace_func", replace_func, "None (torchmb never used it)")
        template = copy_module(model)
        pieces = fast.plan(template, self.batch)
        native = None
        if any(True for _ in model.parameters()):
            native = NativeBatchModule(
                model,
                self.batch,
                init="identical",
                # Under the fast path the native module only holds the tensors and probes.
                strategy="vmap" if pieces else strategy,
                check_isolation=check_isolation,
            )
            stack = native.stack
        else:
            stack = Stack()
            for name, t in template.named_buffers():
                stack.put(name, t.detach().unsqueeze(0).repeat_interleave(self.batch, 0), False)
        # Plain attributes (not submodules): set before the stacked layers take the names.
        self.__dict__.update(
            _native=native, _template=template, _pieces=pieces, _run=_Run(), _stack=stack
        )
        self._adopt()
        # nn.Module.train sets this module and the stacked tensors' holders only: the
        # template and the native module keep each submodule's own mode, as `model` has it
        # (a BatchNorm held in eval inside a training model stays in eval).
        nn.Module.train(self, model.training)
        for piece in pieces or ():
            if piece.custom is not None:  # a registered batch module: its base's mode
                piece.custom.train(piece.module.training)

    def _adopt(self) -> None:
        """Shows the stacked tensors under the model's own names (torchmb's state_dict keys)."""
        for mine, theirs in (
            (self._parameters, self._stack._parameters),
            (self._buffers, self._stack._buffers),
            (self._modules, self._stack._modules),
        ):
            mine.clear()
            mine.update(theirs)  # type: ignore[arg-type]

    @property
    def native(self) -> NativeBatchModule | None:
        """The `dualtrain_torch.BatchModule` holding the same tensors (``extract(i)``, ...).

        None for a model without parameters.
        """
        return self._native

    def to_batch_func(self, node: Any, batch: int) -> Any:
        """`to_batch_func` (``torchmb.utils``) for `node`; the model's calls need none."""
        return to_batch_func(node, batch)

    def to_batch_module(self, node: Any, module: nn.Module, batch: int) -> AbstractBatchModule:
        """`to_batch_module` (``torchmb.utils``): the registered batch module for `module`."""
        return to_batch_module(node, module, batch)

    def train(self, mode: bool = True) -> BatchModule:
        super().train(mode)
        for m in self._others():
            m.train(mode)
        return self

    def _apply(self, fn: Any, recurse: bool = True) -> BatchModule:
        if self._native is not None:
            self._native._apply(fn, recurse)  # the stack and the native template
        else:
            self._stack._apply(fn, recurse)
        for m in self._others():
            m._apply(fn, recurse)
        self._adopt()
        return self

    def _others(self) -> list[nn.Module]:
        """The modules outside the tensor tree: templates and registered batch modules."""
        out: list[nn.Module] = [self._template]
        out += [p.custom for p in self._pieces or () if p.custom is not None]
        out += [self._native] if self._native is not None else []
        return out

    def forward(
        self,
        *x: torch.Tensor,
        merge: bool = True,
        split: bool = True,
        data_order: DataOrder = "g b",
    ) -> Any:
        """The members' outputs for inputs in `data_order` (torchmb's call).

        Args:
            *x: the inputs, ``[G, B, ...]`` for ``data_order='g b'``, ``[B, G, ...]`` for
                ``'b g'``, or flattened ``[(G*B), ...]`` for ``'(g b)'`` / ``'(b g)'``.
            merge: False: the inputs are already merged in ``(b g)`` order.
            split: False: return the outputs merged in ``(b g)`` order.
            data_order: the layout of inputs and outputs.

        Returns:
            One tensor (or a tuple, for several outputs) in `data_order`.

        Raises:
            ArgumentError: no input, a non-tensor, or an unknown data order.
            ShapeError: an input without G where `data_order` puts it.
        """
        if not x:
            raise ArgumentError("BatchModule needs at least one input; got none")
        for i, t in enumerate(x):
            if not isinstance(t, torch.Tensor):
                raise bad_argument(f"x[{i}]", type(t).__name__, "a tensor")
        members.check_flag("merge", merge)
        members.check_flag("split", split)
        xs = tuple(to_members(t, self.batch, data_order if merge else "(b g)") for t in x)
        out = self._members(xs)
        order = data_order if split else "(b g)"
        out = pytree.tree_map(
            lambda t: from_members(t, order) if isinstance(t, torch.Tensor) else t, out
        )
        if isinstance(out, (tuple, list)) and len(out) == 1:
            return out[0]
        return out

    def _members(self, xs: tuple[torch.Tensor, ...]) -> Any:
        params: dict[str, torch.Tensor] = dict(self.named_parameters())
        buffers = dict(self.named_buffers())
        if self._pieces is None:
            if self._native is not None:
                return self._native(*xs)
            return fast.run_generic(self._template, params, buffers, xs)
        if self._run.checked is None:
            self._run.checked = fast.verify(self._pieces, self.batch, params, buffers, xs)
            if self._native is not None:
                self._native.tune(*xs)  # the isolation probe, on the generic path
        return fast.run_fast(self._pieces, self.batch, params, buffers, xs)

    def explain(self) -> str:
        """The native report, and which registered batch modules run and were checked."""
        lines = [self._native.explain()] if self._native is not None else []
        if self._pieces is not None:
            names = [p.label() for p in self._pieces if p.custom is not None]
            state = self._run.checked or "not yet checked (the first call checks them)"
            lines.append(f"  torchmb fast path: {names}; {state}")
        return "\n".join(lines)

    def extra_repr(self) -> str:
        fast = [p.label() for p in self._pieces or () if p.custom is not None]
        return f"batch={self.batch}" + (f", fast path={fast}" if fast else "")
