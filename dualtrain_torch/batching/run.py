"""How a torch BatchModule runs its members: the strategies, their timing, the probe.

Every strategy calls the one template module through ``torch.func.functional_call`` with
member i's slice of the stacked parameters and buffers: "vmap" maps over all members at
once, "chunked" maps over chunks of members in turn, "loop" calls the members one by one.
Buffers are passed as slices of the stacked buffers, so BatchNorm's in-place running-stat
updates land in each member's own row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.utils import _pytree as pytree

from dualtrain_torch.batching import optim as batching_optim, stacked as batching_stacked

__all__ = [
    "Run",
    "check_stacked",
    "fixed_rng",
    "float_leaves",
    "match_gradient_layout",
    "member_bytes",
    "member_inputs",
    "member_rows",
    "run_members",
    "stacked_plan",
    "step_runs",
    "timed_runs",
]

Tensors = dict[str, torch.Tensor]
_PLANS: weakref.WeakKeyDictionary[nn.Module, batching_stacked.Plan | None] = (
    weakref.WeakKeyDictionary()
)


def stacked_plan(template: nn.Module) -> batching_stacked.Plan | None:
    """The stacked strategy's plan for `template` (worked out once per template)."""
    try:
        return _PLANS[template]
    except KeyError:
        found = _PLANS[template] = batching_stacked.plan(template)
        return found


def member_rows(tensors: Tensors, index: Any) -> dict[str, torch.Tensor]:
    """Row(s) `index` of every stacked tensor."""
    return {k: v[index] for k, v in tensors.items()}


def _groups(tensors: Tensors, size: int | None) -> list[dict[str, torch.Tensor]]:
    """Every tensor's rows one member (`size` None) or `size` members at a time.

    ``unbind``/``split`` views: their backward is one stack or cat of the groups'
    gradients, where indexing row by row makes a full-size zero gradient per row (for 128
    LeNets that was gigabytes of memset a step).
    """
    names = list(tensors)
    cut = [t.unbind(0) if size is None else t.split(size) for t in tensors.values()]
    return [dict(zip(names, group, strict=True)) for group in zip(*cut, strict=True)]


def member_inputs(inputs: Sequence[Any], index: Any, shared: bool) -> tuple[Any, ...]:
    """Row(s) `index` of each input's tensors (every input as it is when `shared`)."""
    if shared:
        return tuple(inputs)
    # Tensors inside tuples, lists and dicts are per member too, as vmap's in_dims say.
    return tuple(
        pytree.tree_map(lambda t: t[index] if isinstance(t, torch.Tensor) else t, x) for x in inputs
    )


def _input_dims(inputs: Sequence[Any], shared: bool) -> tuple[Any, ...]:
    """Vmap's in_dims for the inputs: 0 for every tensor leaf (None when shared)."""
    return tuple(
        pytree.tree_map(lambda t: None if shared or not isinstance(t, torch.Tensor) else 0, x)
        for x in inputs
    )


def run_members(
    template: nn.Module,
    strategy: str,
    chunk: int | None,
    params: Tensors,
    buffers: Tensors,
    inputs: Sequence[Any],
    shared: bool,
) -> Any:
    """The members' outputs, ``[batch, ...]`` per output leaf, under `strategy`."""
    batch = next(iter(params.values())).shape[0]
    if strategy == "stacked":
        layers = stacked_plan(template)
        device = next(iter(params.values())).device.type
        if (
            layers is not None
            and not batching_stacked.global_hooks()
            and not torch.is_autocast_enabled(device)
        ):
            return batching_stacked.run(layers, params, inputs, shared, batch)
        # Hooks for every module run only under functional_call; autocast casts each
        # layer's call as the module's own call is cast: vmap keeps both as they are.
        strategy = "vmap"
    if strategy == "loop":
        outs = [
            functional_call(
                template, (rows, member_rows(buffers, i)), member_inputs(inputs, i, shared)
            )
            for i, rows in enumerate(_groups(params, None))
        ]
        return _stack(outs)
    dims = _input_dims(inputs, shared)

    def one(p: Tensors, b: Tensors, *x: Any) -> Any:
        return functional_call(template, (p, b), x)

    mapped = vmap(one, in_dims=(0, 0, *dims), randomness="different")
    if strategy == "vmap" or chunk is None or chunk >= batch:
        return mapped(params, buffers, *inputs)
    parts = []
    for start, group in zip(range(0, batch, chunk), _groups(params, chunk), strict=True):
        rows = slice(start, start + chunk)
        x = member_inputs(inputs, rows, shared)
        parts.append(mapped(group, member_rows(buffers, rows), *x))
    return _concat(parts)


@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compared by identity
class Run:
    """One call of the members under one strategy: `run_members`'s arguments as one value.

    What the work around a call takes (the probe, a timed step, the gradient layout); the
    forward itself calls `run_members` with them unwrapped.
    """

    template: nn.Module
    strategy: str
    chunk: int | None
    params: Tensors
    buffers: Tensors
    inputs: Sequence[Any]
    shared: bool

    def on(self, params: Tensors, buffers: Tensors, inputs: Sequence[Any]) -> Any:
        """The members' outputs under this run's strategy for other values of the same kind."""
        return run_members(
            self.template, self.strategy, self.chunk, params, buffers, inputs, self.shared
        )


def _stack(outs: list[Any]) -> Any:
    flat = [pytree.tree_flatten(o) for o in outs]
    spec = flat[0][1]
    leaves = [torch.stack(group) for group in zip(*(f[0] for f in flat), strict=True)]
    return pytree.tree_unflatten(leaves, spec)


def _concat(parts: list[Any]) -> Any:
    flat = [pytree.tree_flatten(o) for o in parts]
    leaves = [torch.cat(group) for group in zip(*(f[0] for f in flat), strict=True)]
    return pytree.tree_unflatten(leaves, flat[0][1])


def float_leaves(out: Any) -> list[torch.Tensor]:
    """The float tensors of `out` that a backward reaches."""
    return [
        t
        for t in pytree.tree_leaves(out)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]


@contextlib.contextmanager
def fixed_rng(device: torch.device, seed: int = 0) -> Iterator[None]:
    """Forks the RNG (so probing and timing leave the caller's draws alone) and seeds it."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_runs(
    template: nn.Module,
    options: Mapping[str, int | None],
    params: Tensors,
    buffers: Tensors,
    inputs: Sequence[Any],
    shared: bool,
    members: int | None = None,
) -> dict[str, Callable[[], None]]:
    """One callable per candidate: a forward, and a backward when gradients are on.

    Each runs on copies of the buffers, so timing never moves the running statistics;
    `members` runs only the first that many (copies of their rows).
    """
    if members is not None:
        params = {
            k: v[:members].detach().requires_grad_(v.requires_grad) for k, v in params.items()
        }
        buffers = {k: v[:members] for k, v in buffers.items()}
        inputs = member_inputs(inputs, slice(0, members), shared)
    device = next(iter(params.values())).device
    backward = torch.is_grad_enabled()
    plist = [p for p in params.values() if p.requires_grad]

    def make(strategy: str, chunk: int | None) -> Callable[[], None]:
        def run() -> None:
            with fixed_rng(device):
                copies = {k: v.clone() for k, v in buffers.items()}
                out = run_members(template, strategy, chunk, params, copies, inputs, shared)
                leaves = float_leaves(out)
                if backward and leaves and plist:
                    total = cast(torch.Tensor, sum(t.sum() for t in leaves))
                    torch.autograd.grad(total, plist, allow_unused=True)
            _sync(device)

        return run

    return {name: make(name, chunk) for name, chunk in options.items()}


def step_runs(run: Run) -> dict[str, Callable[[], None]]:
    """A whole training step, batched and as one member alone, for `dispatch.decide`.

    "batched": every member's forward and backward under `strategy`, then
    `member_optimizer`'s Adam over copies of the stacked parameters; "optimizer": that Adam
    step alone (``dispatch.decide`` adds it to the forward and backward it has just timed,
    rather than run the whole step again); "separate": member 0 alone on its own
    contiguous copies (its inputs, a plain call of the template, the fused Adam kernel of
    ``torch.optim.Adam(fused=True)``), as one of N separate trainings runs. Nothing the
    caller holds changes. Empty outside training (no gradients, or nothing trainable).
    """
    params, buffers, inputs = run.params, run.buffers, run.inputs
    names = [k for k, p in params.items() if p.requires_grad]
    if not torch.is_grad_enabled() or not names:
        return {}
    device = next(iter(params.values())).device
    batch = next(iter(params.values())).shape[0]
    # Neither side builds a torch.optim optimizer: torch's import of torch._dynamo on
    # their first call would cost this first call seconds.
    stacked = [params[k].detach().clone().requires_grad_(True) for k in names]
    batched_opt = batching_optim.member_optimizer(stacked, "adam", batch, lr=1e-3)
    one = {k: v[0].detach().clone().requires_grad_(v.requires_grad) for k, v in params.items()}
    alone = [one[k] for k in names]
    alone_opt = _PlainAdam(alone)
    mine = dict(zip(names, alone, strict=True))
    first = member_inputs(inputs, 0, run.shared)

    def batched() -> None:
        with fixed_rng(device):
            copies = {k: v.clone() for k, v in buffers.items()}
            live = dict(params) | dict(zip(names, stacked, strict=True))
            _step(run.on(live, copies, inputs), stacked, batched_opt.step)
        _sync(device)

    def separate() -> None:
        with fixed_rng(device):
            copies = {k: v[0].clone() for k, v in buffers.items()}
            out = functional_call(run.template, (one | mine, copies), first)
            _step(out, alone, alone_opt.step)
        _sync(device)

    def optimizer() -> None:
        for t in stacked:
            if t.grad is None:  # Adam's step costs the same whatever the gradient's values
                t.grad = torch.zeros_like(t)
        batched_opt.step()
        _sync(device)

    return {"batched": batched, "optimizer": optimizer, "separate": separate}


class _PlainAdam:
    """One model's Adam step as ``torch.optim.Adam(fused=True)`` runs it (its kernel)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.avgs = [torch.zeros_like(t) for t in tensors]
        self.squares = [torch.zeros_like(t) for t in tensors]
        self.steps = [torch.zeros((), dtype=torch.float32, device=t.device) for t in tensors]

    def step(self) -> None:
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in self.tensors]
        torch._foreach_add_(self.steps, 1.0)
        try:
            torch._fused_adam_(
                self.tensors, grads, self.avgs, self.squares, [], self.steps,
                lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                amsgrad=False, maximize=False,
            )  # fmt: skip
        except (RuntimeError, NotImplementedError):  # a device or dtype without the kernel
            for t, g, m, v in zip(self.tensors, grads, self.avgs, self.squares, strict=True):
                m.lerp_(g, 0.1)
                v.mul_(0.999).addcmul_(g, g, value=0.001)
                t.data.addcdiv_(m, v.sqrt().add_(1e-8), value=-1e-3)


def _step(out: Any, tensors: list[torch.Tensor], update: Callable[[], Any]) -> None:
    leaves = float_leaves(out)
    if not leaves:
        return
    total = cast(torch.Tensor, sum(t.sum() for t in leaves))
    grads = torch.autograd.grad(total, tensors, allow_unused=True)
    for t, g in zip(tensors, grads, strict=True):
        t.grad = g
    update()


def check_stacked(
    template: nn.Module, params: Tensors, buffers: Tensors, inputs: Sequence[Any], shared: bool
) -> str | None:
    """What the stacked strategy computes differently from vmap on these inputs, or None.

    Outputs and parameter gradients (one random cotangent) are compared; dropout layers
    are held in eval for the check (their draws differ between strategies by design).
    """
    # Two members show any mixing or misplacement as well as all of them, at a fraction
    # of the cost (this runs on the first call, on a cold cache too).
    few = slice(0, 2)
    params = {k: v[few].detach().requires_grad_(v.requires_grad) for k, v in params.items()}
    buffers = {k: v[few] for k, v in buffers.items()}
    inputs = member_inputs(inputs, few, shared)
    device = next(iter(params.values())).device
    dropouts = [m for m in template.modules() if isinstance(m, nn.Dropout) and m.training]
    try:
        for m in dropouts:
            m.training = False
        with fixed_rng(device):

            def compute(strategy: str) -> torch.Tensor:
                copies = {k: v.clone() for k, v in buffers.items()}
                out = run_members(template, strategy, None, params, copies, inputs, shared)
                if not isinstance(out, torch.Tensor):
                    raise TypeError(f"a Sequential returns one tensor; got {type(out).__name__}")
                return out

            return batching_stacked.verify(
                lambda: compute("stacked"), lambda: compute("vmap"), params
            )
    except Exception as error:  # a shape this plan cannot run: the strategy is refused
        return f"{type(error).__name__}: {error}".splitlines()[0][:200]
    finally:
        for m in dropouts:
            m.training = True


def match_gradient_layout(run: Run) -> list[str]:
    """Lays each parameter out in memory as its gradient under `strategy` comes out.

    Values are kept; only strides change (``p.data`` is replaced, so optimizers keep the
    same parameter objects). Autograd's gradient of a vmapped Linear weight holds each
    member's matrix transposed in memory; accumulated into a row-major parameter it costs a
    strided copy every step (measured: 32 MLPs 784-256-256-10, 116 -> 48 ms a step). A
    parameter laid out like its gradient takes it as it is. Returns the names changed.
    """
    params = run.params
    device = next(iter(params.values())).device
    names = [k for k, p in params.items() if p.requires_grad]
    with fixed_rng(device):
        copies = {k: v.clone() for k, v in run.buffers.items()}
        leaves = float_leaves(run.on(params, copies, run.inputs))
        if not leaves or not names:
            return []
        total = cast(torch.Tensor, sum(t.sum() for t in leaves))
        grads = torch.autograd.grad(total, [params[k] for k in names], allow_unused=True)
    changed = []
    with torch.no_grad():
        for name, grad in zip(names, grads, strict=True):
            p = params[name]
            if grad is None or grad.stride() == p.stride() or grad.shape != p.shape:
                continue
            laid = torch.empty_like(grad)  # keeps a dense layout's strides, else contiguous
            if laid.stride() != grad.stride():
                continue
            laid.copy_(p)
            p.data = laid
            changed.append(name)
    return changed


def member_bytes(
    template: nn.Module, params: Tensors, buffers: Tensors, inputs: Sequence[Any], shared: bool
) -> int:
    """Estimated bytes of one member's call.

    Parameters and their gradients, buffers, inputs, outputs and the activations autograd
    saves for the backward pass.
    """
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    one = slice(0, 1)
    with fixed_rng(next(iter(params.values())).device):
        copies = {k: v[one].clone() for k, v in buffers.items()}
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = run_members(
                template,
                "loop",
                None,
                member_rows(params, one),
                copies,
                member_inputs(inputs, one, shared),
                shared,
            )
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))  # noqa: E731
    per = lambda ts: size(ts) // max(1, next(iter(params.values())).shape[0])  # noqa: E731
    inputs_bytes = 0 if shared else per(pytree.tree_leaves(list(inputs)))
    return (
        2 * per(params.values())
        + per(buffers.values())
        + inputs_bytes
        + size(pytree.tree_leaves(out))
        + saved
    )
