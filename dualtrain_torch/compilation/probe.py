"""What a torch trial computes for the ladder, and the snapshot that keeps it side-effect free.

Each trial runs the batch in hand from the same snapshot (parameters, gradients, buffers,
optimizer state, CPU and CUDA RNG, and the generators the model holds) on fresh copies of
the inputs (`fresh_inputs`: a forward that writes into its inputs writes into the copies,
and a trial never reaches into the graph that produced them), and hands the ladder host
copies of what it computed: the outputs, the inputs as the forward left them, then, in
training, the gradients of a fixed random projection of the outputs with respect to every
trainable parameter and input (``torch.autograd.grad``: ``.grad`` is never touched), then
the buffers as the batch left them (BatchNorm's running statistics). Also here: which
submodules run in another mode than the root (`mixed_modes`), and whether what an ONNX
graph was exported with is still what the module holds (`Frozen`).
"""

from __future__ import annotations

import dis
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

__all__ = [
    "MODULE_INTERNALS",
    "Frozen",
    "Snapshot",
    "fresh_inputs",
    "generators",
    "host",
    "probe_results",
    "timed_forward",
]


def generators(module: nn.Module) -> list[torch.Generator]:
    """The ``torch.Generator`` objects `module` and its submodules hold as attributes.

    A model that draws from its own generator (``torch.randn(..., generator=self.gen)``)
    keeps RNG state that torch's global state does not cover.
    """
    found: dict[int, torch.Generator] = {}
    for m in module.modules():
        for value in vars(m).values():
            if isinstance(value, torch.Generator):
                found[id(value)] = value
    return list(found.values())


def _fresh_leaf(x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    if x.requires_grad:
        # A copy that is no leaf (as a computed input is not): an in-place op on it works
        # as on the user's tensor, and its gradient is still defined.
        return x.detach().requires_grad_().clone()
    return x.detach().clone()


def fresh_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Copies of the tensors in ``(args, kwargs)``, cut from the graph that made them.

    A trial runs the forward several times: on the user's tensors, a forward that writes
    into its inputs would write into them once per run, and the trial's backward would run
    through (and free) the user's graph upstream of them (a weight shared with an earlier
    layer).
    """
    copies: dict[int, Any] = {}  # one tensor passed twice stays one tensor

    def fresh(x: Any) -> Any:
        if id(x) not in copies:
            copies[id(x)] = _fresh_leaf(x)
        return copies[id(x)]

    fresh_args, fresh_kwargs = pytree.tree_map(fresh, (tuple(args), dict(kwargs)))
    return tuple(fresh_args), fresh_kwargs


# What nn.Module keeps in every instance's __dict__; the user's attributes are the rest.
MODULE_INTERNALS = frozenset(vars(nn.Module()))


def _tensor_version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return None


class _Attributes:
    """The plain attributes of `module` and its submodules, restorable.

    A call counter (``self.calls += 1``), a list a forward appends to, a tensor kept as a
    plain attribute.
    Containers (list, dict, set) are restored in place, one level deep; a tensor is copied
    back in place only when it changed (its version counter moved), so that an unchanged
    one keeps its counter (an exported ONNX graph watches it).
    """

    def __init__(self, module: nn.Module) -> None:
        self._saved: list[tuple[nn.Module, dict[str, tuple[Any, Any, int | None]]]] = []
        for m in module.modules():
            entries = {
                name: self._save(value)
                for name, value in vars(m).items()
                if name not in MODULE_INTERNALS
            }
            self._saved.append((m, entries))

    @staticmethod
    def _save(value: Any) -> tuple[Any, Any, int | None]:
        if isinstance(value, torch.Tensor):
            return value, value.detach().clone(), _tensor_version(value)
        if isinstance(value, list):
            return value, list(value), None
        if isinstance(value, dict):  # a defaultdict too: its items, not its constructor
            return value, dict(value), None
        if isinstance(value, set):
            return value, set(value), None
        return value, None, None

    @torch.no_grad()
    def restore(self) -> None:
        for m, entries in self._saved:
            attributes = vars(m)
            for name in [n for n in attributes if n not in MODULE_INTERNALS and n not in entries]:
                del attributes[name]  # made by the forward
            for name, (value, contents, version) in entries.items():
                attributes[name] = value
                if isinstance(value, torch.Tensor):
                    moved = version is None or _tensor_version(value) != version
                    if moved and not (
                        value.shape == contents.shape and torch.equal(value, contents)
                    ):
                        value.copy_(contents)
                        entries[name] = (value, contents, _tensor_version(value))
                elif isinstance(value, list):
                    value[:] = contents
                elif isinstance(value, (dict, set)):
                    value.clear()
                    value.update(contents)


class Snapshot:
    """Copies of the mutable state of `module` (and `optimizer`), restorable in place.

    In place, so that tensors keep their identity (optimizers and compiled graphs hold them).
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        params: bool = False,
        attributes: bool = False,
    ) -> None:
        # attributes: the modules' plain attributes too (a call counter, a recurrent state).
        self._attributes = _Attributes(module) if attributes else None
        # By slot (the module's dict and the name), not by tensor: a forward that assigns a
        # new tensor (``self.steps = self.steps + 1``, an EMA) replaces the buffer object.
        self._slots: list[tuple[dict[str, Any], list[tuple[str, Any, Any]]]] = []
        for m in module.modules():
            tables: list[dict[str, Any]] = [m._buffers]
            if params:
                tables.append(m._parameters)
            for table in tables:
                saved = [
                    (name, t, None if t is None else t.detach().clone())
                    for name, t in table.items()
                ]
                self._slots.append((table, saved))
        # Gradients too when parameters are: a step trial sets them.
        self._grads = (
            [(p, None if p.grad is None else p.grad.detach().clone()) for p in module.parameters()]
            if params
            else []
        )
        self._optimizer = optimizer
        self._state: dict[Any, dict[str, Any]] = {}
        # What the optimizer updates beyond the module (a temperature in the loss).
        own = {id(p) for p in module.parameters()}
        self._extra = [
            (p, p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
            for group in (optimizer.param_groups if optimizer is not None else [])
            for p in group["params"]
            if id(p) not in own
        ]
        if optimizer is not None:
            for p, entry in optimizer.state.items():
                self._state[p] = {
                    k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                    for k, v in entry.items()
                }
        self._generators = [(g, g.get_state()) for g in generators(module)]
        self._cpu_rng = torch.get_rng_state()
        self._cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    @torch.no_grad()
    def restore(self) -> None:
        """Puts back, in place, everything copied when the snapshot was taken."""
        for table, saved in self._slots:
            names = {name for name, _, _ in saved}
            for name in [n for n in table if n not in names]:
                del table[name]  # registered by the forward
            for name, tensor, copy in saved:
                table[name] = tensor
                if tensor is not None:
                    # Every one: BatchNorm's kernel writes its running statistics without
                    # moving their version counters, so "unchanged" cannot be told apart.
                    tensor.copy_(copy)
        for param, grad in self._grads:
            param.grad = None if grad is None else grad.clone()
        for param, value, grad in self._extra:
            param.copy_(value)
            param.grad = None if grad is None else grad.clone()
        if self._optimizer is not None:
            state = self._optimizer.state
            for p in [p for p in state if p not in self._state]:
                del state[p]  # state the trial created lazily (Adam's first step)
            for p, saved_entry in self._state.items():
                entry = state[p]
                for k, v in saved_entry.items():
                    if isinstance(v, torch.Tensor) and isinstance(entry.get(k), torch.Tensor):
                        entry[k].copy_(v)
                    else:
                        entry[k] = v.clone() if isinstance(v, torch.Tensor) else v
        if self._attributes is not None:
            self._attributes.restore()
        for generator, generator_state in self._generators:
            generator.set_state(generator_state)
        torch.set_rng_state(self._cpu_rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state_all(self._cuda_rng)


def host(t: torch.Tensor) -> np.ndarray:
    """A NumPy copy of `t` on the host (bfloat16 as float32, which holds it exactly)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()  # NumPy has no bfloat16; float32 holds it exactly
    return t.cpu().resolve_conj().resolve_neg().numpy().copy()


def _leaf(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return host(value)
    return np.asarray(repr(value))  # non-tensor outputs must be equal as written


def _projection(out: torch.Tensor) -> torch.Tensor:
    # The same weights for every rung: a generator seeded by the output's shape.
    gen = torch.Generator().manual_seed(1234 + out.numel())
    w = torch.rand(out.shape, generator=gen, dtype=torch.float64) + 0.5
    return w.to(device=out.device, dtype=out.dtype)


def probe_results(
    module: nn.Module, run: Callable[[], Any], inputs: Any
) -> tuple[list[str], list[np.ndarray]]:
    """Runs `run()` once and returns its outputs, inputs, gradients and buffers, on the host.

    `inputs` is what `run` reads (a tree: ``(args, kwargs)``); its tensors are compared
    after the run, so a rung that skips (or adds) a write into an input is caught.
    """
    out = run()
    leaves = pytree.tree_leaves(out)
    names = [f"output[{i}]" for i in range(len(leaves))]
    results = [_leaf(x) for x in leaves]
    tensors = [x for x in pytree.tree_leaves(inputs) if isinstance(x, torch.Tensor)]
    for i, x in enumerate(tensors):
        names.append(f"input[{i}]")
        results.append(host(x))
    differentiable = [
        x
        for x in leaves
        if isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point()
    ]
    if differentiable and torch.is_grad_enabled():
        targets: list[tuple[str, torch.Tensor]] = [
            (n, p) for n, p in module.named_parameters() if p.requires_grad
        ]
        targets += [(f"input[{i}]", x) for i, x in enumerate(tensors) if x.requires_grad]
        if targets:
            loss = torch.stack([(x * _projection(x)).sum().double() for x in differentiable]).sum()
            grads = torch.autograd.grad(loss, [t for _, t in targets], allow_unused=True)
            for (name, target), grad in zip(targets, grads, strict=True):
                names.append(f"grad:{name}")
                results.append(host(torch.zeros_like(target) if grad is None else grad))
    for name, buffer in module.named_buffers():
        names.append(f"buffer:{name}")
        results.append(host(buffer))
    return names, results


def timed_forward(run: Callable[[], Any], module: nn.Module) -> None:
    """One timed training (or eval) forward: `run()`, then the gradients it needs, synced."""
    out = run()
    leaves = [
        x
        for x in pytree.tree_leaves(out)
        if isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point()
    ]
    params = [p for p in module.parameters() if p.requires_grad]
    if leaves and params and torch.is_grad_enabled():
        loss = torch.stack([x.sum().double() for x in leaves]).sum()
        torch.autograd.grad(loss, params, allow_unused=True)
    _sync(leaves or pytree.tree_leaves(out))


def _sync(leaves: Sequence[Any]) -> None:
    for x in leaves:
        if isinstance(x, torch.Tensor) and x.is_cuda:
            torch.cuda.synchronize(x.device)
            return


_HOOKS = ("_forward_pre_hooks", "_forward_hooks")


def _token(t: torch.Tensor, by_value: list[torch.Tensor]) -> tuple[Any, ...]:
    version = _tensor_version(t)
    if version is None:  # an inference tensor keeps no version counter: compare its value
        by_value.append(t)
    return (t.data_ptr(), version, tuple(t.shape), t.dtype, t.device)


def _attribute(value: Any, by_value: list[torch.Tensor], depth: int = 0) -> Any:
    if isinstance(value, torch.Tensor):
        return _token(value, by_value)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return repr(value)  # repr: a NaN equals itself
    if isinstance(value, (tuple, list)) and depth < 2 and len(value) <= 64:
        return tuple(_attribute(v, by_value, depth + 1) for v in value)
    if isinstance(value, dict) and depth < 2 and len(value) <= 64:
        return tuple((repr(k), _attribute(v, by_value, depth + 1)) for k, v in value.items())
    return ("object", id(value))  # re-assigned, it is another object


class Frozen:
    """Whether what an ONNX graph was exported with is still what the module holds.

    A traced graph keeps as constants everything the forward read: parameters, buffers,
    plain attributes (``self.temperature``), tensors kept as plain attributes, the training
    flags and forward hooks of submodules, and the module-level values and closure cells
    the forwards read (``SCALE["k"]``). Parameters and buffers are compared by value: a
    write through ``.data`` (the classic manual update) or BatchNorm's kernel moves no
    version counter. Attributes and read values are compared as `_attribute` keys them
    (numbers, strings, tensors, and tuples, lists and dicts of them two levels deep).
    What is not seen: a change inside a custom object, or a value read by a function the
    forward calls rather than by the forward itself.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.key, values = self._read()
        self.values = [v.detach().clone() for v in values]

    def _read(self) -> tuple[list[Any], list[torch.Tensor]]:
        by_value: list[torch.Tensor] = list(self.module.buffers())
        key: list[Any] = []
        for p in self.module.parameters():
            key.append(_token(p, []))  # identity and version: compared by value below too
            by_value.append(p)
        for m in self.module.modules():
            key.append(m.training)
            key.extend(tuple(getattr(m, hooks, {})) for hooks in _HOOKS)
            key.extend(
                (name, _attribute(value, by_value))
                for name, value in vars(m).items()
                if name not in MODULE_INTERNALS
            )
        for fn in _forwards(self.module):
            key.extend((where, _attribute(value, by_value)) for where, value in _reads(fn))
        return key, by_value

    def same(self) -> bool:
        """Whether the module still holds what it held when this was made."""
        key, values = self._read()
        return (
            key == self.key
            and len(values) == len(self.values)
            and all(
                b.shape == s.shape and b.dtype == s.dtype and torch.equal(b, s)
                for b, s in zip(values, self.values, strict=True)
            )
        )


def _forwards(module: nn.Module) -> Iterator[Callable[..., Any]]:
    """The Python functions a forward of `module` runs as its own body (each class once)."""
    seen: set[Any] = set()
    for m in module.modules():
        for fn in (type(m).forward, getattr(type(getattr(m, "craft", None)), "run", None)):
            code = getattr(fn, "__code__", None)
            if fn is not None and code is not None and code not in seen:
                seen.add(code)
                yield fn


_GLOBALS_READ: dict[types.CodeType, tuple[str, ...]] = {}


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """The global names `code` (and the functions and comprehensions inside it) reads."""
    names = _GLOBALS_READ.get(code)
    if names is None:
        found: list[str] = []
        stack = [code]
        while stack:
            c = stack.pop()
            found += [i.argval for i in dis.get_instructions(c) if i.opname == "LOAD_GLOBAL"]
            stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        names = _GLOBALS_READ[code] = tuple(dict.fromkeys(found))
    return names


_CODE_KINDS = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
               types.MethodType, types.BuiltinMethodType, property)  # fmt: skip


def _reads(fn: Callable[..., Any]) -> Iterator[tuple[str, Any]]:
    """The values `fn` reads from its module's globals and its closure: code excluded."""
    code: types.CodeType = fn.__code__
    space = getattr(fn, "__globals__", {})
    for name in _global_names(code):
        if name in space and not isinstance(space[name], _CODE_KINDS):
            yield f"{fn.__qualname__} reads {name}", space[name]
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if not isinstance(value, _CODE_KINDS):
            yield f"{fn.__qualname__} closes over {name}", value
