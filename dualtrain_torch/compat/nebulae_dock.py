"""Nebulae v0.5's ``nebulae.astrobase.dock`` under torch, on dualtrain's Craft and dock.

Nebulae's dock was eager torch: a ``Craft`` was an ``nn.Module``, built with its weights,
and called as it stood. Here a Nebulae Craft is a `dualtrain.Craft` that realizes itself
(`dualtrain_torch.realize`) the first time it is called, geared or asked for parameters,
and then runs that module. Each Nebulae Craft owns its module: a parent Craft holds its
children's modules as they are, so an optimizer built on a child (``Momentum(net, ...)``)
steps the weights its parent runs.

Layers map onto dock concepts: ``Conv``, ``Dense``, ``MaxPool``, ``AvgPool``, ``Reshape``
onto dock's layers, ``Relu`` onto ``dock.relu``, ``SftmXE`` onto ``dock.cross_entropy``,
``AccCls`` onto ``dock.accuracy``; zero padding before a pool (Nebulae's) is ``dock.pad``.
Optimizers and schedulers are torch.optim's. Where Nebulae's code and its documents
disagree, the code (github SeriaQ/Nebulae, v0.5.15) is followed; docs/migration.md lists
each difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from dualtrain.compat.nebulae.cockpit.engine import latest
from dualtrain.compat.nebulae.toolkit.utility import autoPad
from dualtrain.compat.retired import retire
from dualtrain.craft import Craft as _Craft, dock as _dock
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_torch.craft import (
    CraftModule,
    Nozzle,
    Prober,
    Rudder,
    coat as _coat,
    realize,
    shell as _shell,
)

__all__ = [
    "CUBIC", "LINEAR", "NEAREST", "STEP",
    "AccCls", "Adam", "AdamW", "AvgPool", "Conv", "Craft", "Dense", "Gelu", "MaxPool", "Momentum",
    "Nesterov", "Nozzle", "Ones", "Normal", "Orthog", "Prober", "RMSProp", "Relu", "Reshape",
    "Rudder", "SftmXE", "Sigm", "StepLR", "Tanh", "Uniform", "Void", "WarmUp", "XavierNorm",
    "XavierUnif", "Zeros",
    "autoPad", "coat", "shell",
]  # fmt: skip

NEAREST, LINEAR, CUBIC = 0, 1, 2
STEP = "STEP"  # ``lr_decay=dock.STEP, lr_params=(period, factor)``: a StepLR


# ---- initializers: Nebulae's w_init / b_init, applied with torch's global generator ----


class _Init:
    fill: Callable[..., Any] | None = None

    def __call__(self, params: torch.Tensor | None) -> None:
        if params is not None and self.fill is not None:
            with torch.no_grad():
                type(self).fill(params)  # type: ignore[misc]


class Void(_Init):
    """No parameter: ``b_init=Void()`` builds the layer without a bias."""


class XavierNorm(_Init):
    """Glorot normal (Nebulae's default weight initializer)."""

    fill = staticmethod(nn.init.xavier_normal_)


class XavierUnif(_Init):
    """Glorot uniform."""

    fill = staticmethod(nn.init.xavier_uniform_)


class Orthog(_Init):
    """Orthogonal."""

    fill = staticmethod(nn.init.orthogonal_)


class Ones(_Init):
    """All ones."""

    fill = staticmethod(nn.init.ones_)


class Zeros(_Init):
    """All zeros (Nebulae's default bias initializer)."""

    fill = staticmethod(nn.init.zeros_)


class Normal(_Init):
    """N(mean, std)."""

    def __init__(self, mean: float = 0.0, std: float = 1.0) -> None:
        self.mean, self.std = mean, std

    def __call__(self, params: torch.Tensor | None) -> None:
        if params is not None:
            with torch.no_grad():
                nn.init.normal_(params, self.mean, self.std)


class Uniform(_Init):
    """U(min, max)."""

    def __init__(self, min: float = -1.0, max: float = 1.0) -> None:
        self.low, self.high = min, max

    def __call__(self, params: torch.Tensor | None) -> None:
        if params is not None:
            with torch.no_grad():
                nn.init.uniform_(params, self.low, self.high)


def _check_w_init(w_init: Any) -> Any:
    if not callable(w_init):
        raise bad_argument("w_init", w_init, "an initializer (dock.XavierNorm(), ...) or Void()")
    return w_init


def _has_bias(b_init: Any) -> bool:
    # Nebulae built a bias unless b_init was a Void; None crashed there (None(bias)), and
    # demo_dist passes it, so None means no bias here too.
    if b_init is None or isinstance(b_init, Void):
        return False
    if not callable(b_init):
        raise bad_argument("b_init", b_init, "an initializer (dock.Zeros(), ...), Void() or None")
    return True


# ---- the Craft ----


class Craft(_Craft):
    """Nebulae's Craft: build it, then call it; it realizes itself under torch when first used.

    Args:
        scope: the Craft's name (Nebulae's positional ``scope``).

    ``craft['key'] = tensor`` keeps a tensor under a name for this Craft (``'child/key'``
    reads a child's); ``gear`` takes an Engine or device (places the module and returns
    it), or True / False (training / evaluation mode).
    """

    def __init__(self, scope: str) -> None:
        super().__init__(scope)
        object.__setattr__(self, "_kept", {})
        object.__setattr__(self, "_module", None)

    @property
    def scope(self) -> str:
        """The Craft's name; Nebulae's Crafts set it again in their own __init__."""
        return self.__dict__.get("_scope", "")

    @scope.setter
    def scope(self, value: str) -> None:
        if not isinstance(value, str):
            raise bad_argument("scope", value, "a str")
        object.__setattr__(self, "_scope", value)

    # Children that are Nebulae Crafts take part as their own modules, so one set of
    # weights serves the child called alone, from a parent, and by an optimizer built on it.
    def parts(self) -> dict[str, Any]:
        return {name: _as_module(part) for name, part in super().parts().items()}

    def module(self) -> CraftModule:
        """This Craft's torch module, realized on first use (on its geared device).

        Its initial weights come from torch's global generator (``torch.manual_seed`` or
        ``toolkit.destine`` reproduce them), as Nebulae's did; then Nebulae's
        initializers (``w_init`` / ``b_init``) apply.
        """
        made = self.__dict__.get("_module")
        if made is None:
            seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
            made = realize(self, seed=seed, device=self.geared)
            self.initialize(made)
            object.__setattr__(self, "_module", made)
        return made

    # dualtrain_torch.realize holds a Craft with this method as the module it returns,
    # wherever it sits (a plain Craft's attribute, a dock.Sequential, a list...)
    __realized__ = module

    @property
    def training(self) -> bool:
        """Whether its module is in training mode."""
        return self.module().training

    def initialize(self, module: CraftModule) -> None:
        """Applies Nebulae's initializers once realized (layers with w_init / b_init)."""

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        # Alone or from a parent's run, a Nebulae Craft runs its own module (its module's
        # forward calls `run`, never this).
        return self.module()(*inputs, **kwargs)

    def gear(self, gr: Any) -> Craft:
        """True / False: training / evaluation mode; an Engine or device: placed there.

        Returns the Craft, as Nebulae's did (``net = net.gear(engine)``).
        """
        if isinstance(gr, bool):
            self.module().train(gr)
        elif isinstance(gr, (Rudder, Prober, Nozzle)):
            self.module().train(gr.train)
        else:
            super().gear(gr)
            self.module().gear(gr)
        return self

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Nebulae's ``forward``: the same as calling the Craft."""
        return self(*inputs, **kwargs)

    def vars(self) -> Iterator[nn.Parameter]:
        """Nebulae's name for ``parameters()``."""
        return self.module().parameters()

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        return self.module().parameters(recurse)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        return self.module().named_parameters(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module().state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module().load_state_dict(*args, **kwargs)

    def train(self, mode: bool = True) -> Craft:
        self.module().train(mode)
        return self

    def eval(self) -> Craft:
        self.module().eval()
        return self

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str) or "/" in key:
            raise bad_argument("key", key, "a name without '/' (a Craft keeps its own tensors)")
        self.__dict__["_kept"][key] = value

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str):
            raise bad_argument("key", key, "a name, or 'child/name' for a child's")
        *path, last = key.split("/")
        craft: Any = self
        for step in path:
            craft = getattr(craft, step, None)
            if not isinstance(craft, Craft):
                raise bad_argument("key", key, f"a path of child Crafts; {step!r} is not one")
        if last == "":
            return craft
        kept = craft.__dict__["_kept"]
        if last not in kept:
            raise KeyError(
                f"{type(craft).__name__} keeps no tensor {last!r}; it keeps {sorted(kept)}"
            )
        return kept[last]


def _as_module(part: Any) -> Any:
    if isinstance(part, Craft):
        return part.module()
    if isinstance(part, (list, tuple)):
        return type(part)(_as_module(p) for p in part)
    if isinstance(part, dict):
        return {k: _as_module(v) for k, v in part.items()}
    return part


# ---- layers ----


def _flat_pads(name: str, padding: Any, dim: int) -> tuple[tuple[int, int], ...]:
    """Nebulae's padding (an int, or F.pad's flat list, last axis first) as pairs, first first."""
    if isinstance(padding, int) and not isinstance(padding, bool) and padding >= 0:
        return ((padding, padding),) * dim
    flat = list(padding) if isinstance(padding, (tuple, list)) else None
    if (
        flat is None
        or len(flat) != 2 * dim
        or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in flat)
    ):
        raise bad_argument(
            name, padding, f"an int >= 0 or {2 * dim} of them, last axis first (autoPad's order)"
        )
    pairs = [(flat[i], flat[i + 1]) for i in range(0, 2 * dim, 2)]
    return tuple(reversed(pairs))


def _kernel(kernel: Any) -> tuple[int, ...]:
    if not isinstance(kernel, (tuple, list)) or not 1 <= len(kernel) <= 3:
        raise bad_argument(
            "kernel", kernel, "a tuple of 1 to 3 sizes (Nebulae's kernels are tuples)"
        )
    return tuple(kernel)


def _initialize(layer: Any, w_init: Any, b_init: Any) -> None:
    """Nebulae's initializers on a realized layer: `w_init` its weight, `b_init` its bias."""
    w_init(layer.weight)
    if layer.bias is not None:
        b_init(layer.bias)


class Conv(Craft):
    """Nebulae's Conv: ``dock.Conv`` after zero padding (an int, or autoPad's flat list)."""

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        kernel: tuple[int, ...],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        group: int = 1,
        w_init: Any = XavierNorm(),  # noqa: B008 - Nebulae's defaults, shared and stateless
        b_init: Any = Zeros(),  # noqa: B008
        scope: str = "CONV",
    ) -> None:
        super().__init__(scope)
        kernel = _kernel(kernel)
        pads = _flat_pads("padding", padding, len(kernel))
        self.w_init, self.b_init = _check_w_init(w_init), b_init
        self.conv = _dock.Conv(
            in_chs, out_chs, kernel, stride=stride, padding=pads, dilation=dilation,
            groups=group, bias=_has_bias(b_init),
        )  # fmt: skip

    def initialize(self, module: CraftModule) -> None:
        _initialize(module.conv, self.w_init, self.b_init)

    def run(self, x: Any) -> Any:
        return self.conv(x)


class Dense(Craft):
    """Nebulae's Dense: ``dock.Dense`` over `axis` (the last by default)."""

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        axis: int = -1,
        w_init: Any = XavierNorm(),  # noqa: B008
        b_init: Any = Zeros(),  # noqa: B008
        scope: str = "DENSE",
    ) -> None:
        super().__init__(scope)
        if not isinstance(axis, int) or isinstance(axis, bool) or axis == 0:
            raise bad_argument("axis", axis, "an int other than 0 (axis 0 is the batch)")
        self.axis, self.w_init, self.b_init = axis, _check_w_init(w_init), b_init
        self.fc = _dock.Dense(in_chs, out_chs, bias=_has_bias(b_init))

    def initialize(self, module: CraftModule) -> None:
        _initialize(module.fc, self.w_init, self.b_init)

    def run(self, x: Any) -> Any:
        if self.axis in (-1, x.ndim - 1):
            return self.fc(x)
        return self.fc(x.movedim(self.axis, -1)).movedim(-1, self.axis)


def _pool_init(scope: str) -> Callable[..., None]:
    """A pool's ``__init__`` with Nebulae's signature, `scope` defaulting to the class's own."""

    def __init__(  # noqa: N807 - it becomes the class's own __init__
        self: _Pool, kernel: tuple[int, ...], stride: Any = 2, padding: Any = 0, scope: str = scope
    ) -> None:
        Craft.__init__(self, scope)
        kernel = _kernel(kernel)
        self.dim = len(kernel)
        self.is_global = kernel[-1] < 0  # Nebulae: a negative size pools the whole map
        if self.is_global and padding != 0:
            raise bad_argument("padding", padding, "0 for a global pool (kernel < 0)")
        self.pads = _flat_pads("padding", padding, self.dim)
        if self.is_global:
            self.pool = getattr(_dock, f"Global{self.kind}Pool")()
        else:
            self.pool = getattr(_dock, f"{self.kind}Pool")(kernel, stride=stride)

    return __init__


class _Pool(Craft):
    """Nebulae's pools: zero padding, then the dock's pool named by `kind`.

    A negative kernel size pools the whole map; stride 2 by default.
    """

    kind: str
    dim: int
    is_global: bool
    pads: Any
    pool: Any

    def run(self, x: Any) -> Any:
        if any(lo or hi for lo, hi in self.pads):
            x = _dock.pad(x, self.pads)  # zeros, as Nebulae's ConstantPad
        y = self.pool(x)
        # Nebulae's global pool kept the spatial axes, at size 1
        return y.reshape(tuple(y.shape) + (1,) * self.dim) if self.is_global else y


class MaxPool(_Pool):
    """Nebulae's MaxPool: zero padding (not -inf), then ``dock.MaxPool``."""

    kind = "Max"
    __init__ = _pool_init("MPOOL")


class AvgPool(_Pool):
    """Nebulae's AvgPool: zero padding (counted in the mean), then ``dock.AvgPool``."""

    kind = "Avg"
    __init__ = _pool_init("APOOL")


def Reshape(scope: str = "RESHAPE") -> Any:  # noqa: N802 - Nebulae's class name
    """Nebulae's Reshape, ``flat(x, shape)``: dock's Reshape (the shape given per call)."""
    if not isinstance(scope, str):
        raise bad_argument("scope", scope, "a str")
    return _dock.Reshape()


class Relu(Craft):
    """max(x, 0): ``dock.relu``."""

    op = staticmethod(_dock.relu)

    def __init__(self, scope: str = "RELU") -> None:
        super().__init__(scope)

    def run(self, x: Any) -> Any:
        return type(self).op(x)


class Tanh(Relu):
    """``dock.tanh``."""

    op = staticmethod(_dock.tanh)

    def __init__(self, scope: str = "TANH") -> None:
        super().__init__(scope)


class Sigm(Relu):
    """The logistic sigmoid: ``dock.sigmoid``."""

    op = staticmethod(_dock.sigmoid)

    def __init__(self, scope: str = "SIGM") -> None:
        super().__init__(scope)


class Gelu(Relu):
    """The exact (erf) GELU: ``dock.gelu``."""

    op = staticmethod(_dock.gelu)

    def __init__(self, scope: str = "GELU") -> None:
        super().__init__(scope)


# ---- losses and metrics ----


class SftmXE(Craft):
    """Softmax cross-entropy, the mean over rows: ``dock.cross_entropy``.

    Args:
        is_one_hot: labels come one-hot ``(N, K)`` (their argmax is taken), else ``(N,)``.
    """

    def __init__(self, is_one_hot: bool, scope: str = "SFTMXE") -> None:
        super().__init__(scope)
        if not isinstance(is_one_hot, bool):
            raise bad_argument("is_one_hot", is_one_hot, "a bool")
        self.is_one_hot = is_one_hot

    def run(self, x: Any, y: Any) -> Any:
        if self.is_one_hot:
            y = y.argmax(-1)
        return _dock.cross_entropy(x, y)


class AccCls(Craft):
    """Classification accuracy: ``dock.accuracy`` (single-label), or exact-match (multi).

    Args:
        multi_class: each row's rounded scores must all equal its 0/1 labels.
        is_one_hot: single-label targets come one-hot.
    """

    def __init__(self, multi_class: bool, is_one_hot: bool, scope: str = "ACCCLS") -> None:
        super().__init__(scope)
        if not isinstance(multi_class, bool) or not isinstance(is_one_hot, bool):
            raise bad_argument("multi_class, is_one_hot", (multi_class, is_one_hot), "two bools")
        if multi_class and is_one_hot:
            raise ArgumentError("multi_class=True takes 0/1 label rows; is_one_hot must be False")
        self.multi_class, self.is_one_hot = multi_class, is_one_hot

    def run(self, x: Any, y: Any) -> Any:
        if self.multi_class:
            rows = (torch.round(x) == y).float().mean(-1)
            return (rows == 1).float().mean()
        if self.is_one_hot:
            y = y.argmax(-1)
        return _dock.accuracy(x, y)


# ---- optimizers and schedules: torch.optim's ----


class StepLR:
    """``lr_decay=StepLR(period, factor)``: torch's StepLR, the rate times `factor` each period."""

    def __init__(self, period: int, factor: float) -> None:
        if not isinstance(period, int) or isinstance(period, bool) or period < 1:
            raise bad_argument("period", period, "a positive int of steps")
        self.period, self.factor = period, float(factor)

    def __call__(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        return torch.optim.lr_scheduler.StepLR(optimizer, self.period, gamma=self.factor)


def _schedule(lr_decay: Any, lr_params: Any) -> Any:
    if lr_decay is None or lr_decay is STEP:
        if lr_decay is STEP:
            if not isinstance(lr_params, (tuple, list)) or len(lr_params) != 2:
                raise bad_argument("lr_params", lr_params, "(period, factor) for lr_decay=STEP")
            return StepLR(*lr_params)
        if lr_params is not None:
            raise ArgumentError("lr_params is read only with lr_decay=dock.STEP; give lr_decay")
        return None
    if not callable(lr_decay):
        raise bad_argument(
            "lr_decay", lr_decay, "None, dock.STEP or a schedule like StepLR(300, 0.8)"
        )
    if lr_params is not None:
        raise ArgumentError("lr_params is read only with lr_decay=dock.STEP; drop one of them")
    return lr_decay


def _selected(hull: Any, update_scope: Any) -> list[nn.Parameter]:
    if update_scope is None:
        return list(hull.parameters())
    scopes = [update_scope] if isinstance(update_scope, str) else list(update_scope)
    params: list[nn.Parameter] = []
    for scope in scopes:
        part = hull
        for step in str(scope).split("/"):
            part = getattr(part, step, None)
            if part is None:
                raise bad_argument("update_scope", update_scope, "paths of parts of the hull")
        params += list(part.parameters())
    return params


class _Optimizer:
    """What Nebulae's optimizers share: ``optz(loss)`` back-propagates and steps.

    Every `grad_accum` calls it clips, steps the torch optimizer and the schedule.

    The gradients are zeroed at the first call of each group of `grad_accum` calls, so they
    add up within it (Nebulae zeroed them at every call). The rate rises from 0 over
    `warmup` steps exactly as Nebulae's WarmUpWrapper had it, then `lr_decay` runs.
    """

    def __init__(
        self,
        hull: Any,
        make: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
        lr_decay: Any,
        warmup: int,
        grad_limit: float,
        grad_accum: int,
        update_scope: Any,
        scope: str,
        lr_params: Any,
    ) -> None:
        schedule = _schedule(lr_decay, lr_params)
        for name, value, low in (("warmup", warmup, 0), ("grad_accum", grad_accum, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise bad_argument(name, value, f"an int >= {low}")
        if not isinstance(grad_limit, (int, float)) or isinstance(grad_limit, bool):
            raise bad_argument("grad_limit", grad_limit, "a number (<= 0: no clipping)")
        self.scope, self.grad_limit, self.grad_accum = scope, float(grad_limit), grad_accum
        self.params = _selected(hull, update_scope)
        self.optz = make(self.params)
        after = schedule(self.optz) if schedule is not None else None
        self.lr_decay = WarmUp(self.optz, warmup, after) if warmup else after
        self.calls = 0

    def __call__(self, target: torch.Tensor) -> None:
        if self.calls == 0:
            self.optz.zero_grad()
        target.backward()
        self.calls += 1
        if self.calls == self.grad_accum:
            self.calls = 0
            if self.grad_limit > 0:
                nn.utils.clip_grad_value_(self.params, self.grad_limit)
            self.optz.step()
            if self.lr_decay is not None:
                self.lr_decay.step()

    def state_dict(self) -> dict[str, Any]:
        """The torch optimizer's state (what a checkpoint keeps)."""
        return self.optz.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optz.load_state_dict(state)


def _moment_init(mmnt: float, scope: str) -> Callable[..., None]:
    """A one-moment optimizer's ``__init__``: Nebulae's signature, with the class's defaults.

    Held once for Momentum, Nesterov and RMSProp, so that every argument may be given by
    position (as Nebulae's own signatures allow) and ``help()`` shows each class's defaults.
    """

    def __init__(  # noqa: N807 - it becomes the class's own __init__
        self: _MomentOptimizer,
        hull: Any,
        lr: float,
        mmnt: float = mmnt,
        wd: float = 0,
        lr_decay: Any = None,
        warmup: int = 0,
        grad_limit: float = -1,
        grad_accum: int = 1,
        update_scope: Any = None,
        scope: str = scope,
        lr_params: Any = None,
    ) -> None:
        def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
            return self.torch_optimizer(params, lr, mmnt, wd)

        _Optimizer.__init__(self, hull, make, lr_decay, warmup, grad_limit, grad_accum,
                            update_scope, scope, lr_params)  # fmt: skip

    return __init__


class _MomentOptimizer(_Optimizer):
    """Nebulae's optimizers with one moment (`mmnt`): the torch optimizer each makes."""

    def torch_optimizer(
        self, params: list[nn.Parameter], lr: float, mmnt: float, wd: float
    ) -> torch.optim.Optimizer:
        raise NotImplementedError


class Momentum(_MomentOptimizer):
    """SGD with momentum (``torch.optim.SGD``); ``optz(loss)`` steps.

    Args:
        hull: the model (a Craft or module) whose parameters it updates.
        lr: the learning rate.
        mmnt: momentum.
        wd: weight decay.
        lr_decay: None, a schedule (``StepLR(period, factor)``) or ``STEP`` with `lr_params`.
        warmup: steps of Nebulae's warm-up (the rate 0 for two steps, then rising to `lr`
            at step ``warmup + 1``) before `lr_decay` runs.
        grad_limit: clip each gradient element to ±grad_limit before a step (<= 0: off).
        grad_accum: backward passes per step.
        update_scope: a part path ('net/fc') or a list of them: update only those.
        scope: the optimizer's name.
        lr_params: (period, factor) for ``lr_decay=STEP``.
    """

    nesterov = False
    __init__ = _moment_init(0.9, "MOMENTUM")

    def torch_optimizer(
        self, params: list[nn.Parameter], lr: float, mmnt: float, wd: float
    ) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            params, lr=lr, momentum=mmnt, weight_decay=wd, nesterov=self.nesterov
        )


class Nesterov(Momentum):
    """SGD with Nesterov momentum; Momentum's arguments."""

    nesterov = True
    __init__ = _moment_init(0.9, "NESTEROV")


class RMSProp(_MomentOptimizer):
    """``torch.optim.RMSprop``; Momentum's arguments, `mmnt` 0 by default (Nebulae's)."""

    __init__ = _moment_init(0.0, "RMSPROP")

    def torch_optimizer(
        self, params: list[nn.Parameter], lr: float, mmnt: float, wd: float
    ) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(params, lr=lr, momentum=mmnt, weight_decay=wd)


def _adam_init(scope: str) -> Callable[..., None]:
    """Adam's and AdamW's ``__init__``: Nebulae's signature, with the class's scope."""

    def __init__(  # noqa: N807 - it becomes the class's own __init__
        self: Adam,
        hull: Any,
        lr: float,
        mmnt1: float = 0.9,
        mmnt2: float = 0.999,
        wd: float = 0,
        lr_decay: Any = None,
        warmup: int = 0,
        grad_limit: float = -1,
        grad_accum: int = 1,
        update_scope: Any = None,
        scope: str = scope,
        lr_params: Any = None,
    ) -> None:
        kind = torch.optim.AdamW if self.decoupled else torch.optim.Adam

        def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
            return kind(params, lr=lr, betas=(mmnt1, mmnt2), weight_decay=wd)

        _Optimizer.__init__(self, hull, make, lr_decay, warmup, grad_limit, grad_accum,
                            update_scope, scope, lr_params)  # fmt: skip

    return __init__


class Adam(_Optimizer):
    """``torch.optim.Adam`` with betas ``(mmnt1, mmnt2)``; the other arguments are Momentum's."""

    decoupled = False
    __init__ = _adam_init("ADAM")


class AdamW(Adam):
    """``torch.optim.AdamW`` (decoupled weight decay); Adam's arguments."""

    decoupled = True
    __init__ = _adam_init("ADAMW")


class WarmUp:
    """Nebulae's WarmUpWrapper: the rate rises from 0 to `lr`, then `after` runs.

    The rate is set to 0; each `step` counts a mile from 0 and sets ``lr * mile / warmup``
    up to mile `warmup`; after that `after` steps.

    So the optimizer steps at rate 0 twice, reaches `lr` at step ``warmup + 1`` (0-based),
    and `after` (a torch scheduler, or None) counts from there. ``state_dict`` resumes it.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: int, after: Any) -> None:
        self.optimizer, self.warmup, self.after = optimizer, warmup, after
        self.base = [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]
        self.mile = -1
        for group in optimizer.param_groups:
            group["lr"] = 0.0

    def step(self) -> None:
        self.mile += 1
        if self.mile <= self.warmup:
            for group, base in zip(self.optimizer.param_groups, self.base, strict=True):
                group["lr"] = base * self.mile / self.warmup
        elif self.after is not None:
            self.after.step()

    def state_dict(self) -> dict[str, Any]:
        after = self.after.state_dict() if self.after is not None else None
        return {"mile": self.mile, "base": list(self.base), "after": after}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mile, self.base = int(state["mile"]), list(state["base"])
        if self.after is not None and state.get("after") is not None:
            self.after.load_state_dict(state["after"])


# ---- moving data: the latest Engine's device ----


def coat(datum: Any, as_const: bool = True) -> torch.Tensor:
    """A NumPy array or number as a tensor on the latest Engine's device (Nebulae's coat).

    Nebulae's Engine rebound ``dock.coat`` to itself; this reads the Engine made last in
    the process (`dualtrain.compat.nebulae.cockpit.engine.latest`), the CPU if none.
    """
    engine = latest()
    return _coat(datum, as_const, device=engine.torch_device if engine is not None else None)


def shell(datum: Any, as_np: bool = True) -> Any:
    """A tensor back as NumPy (a single value as a Python number), or detached on the CPU."""
    return _shell(datum, as_np)


# Nebulae v0.5.15's other dock names: not carried over (only the names its demos use are,
# with the common optimizers and activations); each says what to use instead.
_LAYER = "hold a torch.nn module in the Craft (self.x = torch.nn.X(...)), or use {}"
_RETIRED = {
    **{
        n: _LAYER.format(w)
        for n, w in {
            "BN": "dualtrain.dock.BatchNorm",
            "IN": "torch.nn.InstanceNorm2d",
            "LN": "dualtrain.dock.LayerNorm",
            "Dropout": "dualtrain.dock.Dropout",
            "Embed": "dualtrain.dock.Embedding",
            "TransConv": "dualtrain.dock.ConvTranspose",
            "Identity": "torch.nn.Identity",
            "Sftm": "dualtrain.dock.softmax",
            "LRelu": "torch.nn.LeakyReLU",
            "Sftp": "torch.nn.Softplus",
            "Concat": "dualtrain.dock.concat",
            "Mean": "dualtrain.dock.mean",
            "Permute": "x.permute",
            "Expand": "x.expand",
            "Squash": "x.squeeze",
            "Upscale": "torch.nn.Upsample",
            "SubPix": "torch.nn.PixelShuffle",
            "SurPix": "torch.nn.PixelUnshuffle",
            "RNN": "torch.nn.RNN",
            "LSTM": "torch.nn.LSTM",
            "BiRNN": "torch.nn.RNN(bidirectional=True)",
            "BiLSTM": "torch.nn.LSTM(bidirectional=True)",
            "MHAttn": "torch.nn.MultiheadAttention",
            "Clip": "torch.clamp",
        }.items()
    },
    **{
        n: "write it as a torch loss on the outputs: " + w
        for n, w in {
            "MAE": "torch.nn.functional.l1_loss",
            "MSE": "torch.nn.functional.mse_loss",
            "Huber": "torch.nn.functional.huber_loss",
            "SigmXE": "torch.nn.functional.binary_cross_entropy_with_logits",
            "OHEM": "a per-row loss, its top-k rows kept",
        }.items()
    },
    "AdaBelief": "torch.optim has no AdaBelief; dock.Adam / dock.AdamW take the same arguments",
    "PolyLR": "lr_decay takes any callable optimizer -> torch scheduler, e.g. "
    "lambda opt: torch.optim.lr_scheduler.PolynomialLR(opt, total_iters, power)",
    "CosLR": "lr_decay=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, period)",
    "ExpLR": "lr_decay=lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, gamma)",
    "WavyLR": "lr_decay=lambda opt: torch.optim.lr_scheduler.CyclicLR(opt, ...)",
    "EMA": "torch.optim.swa_utils.AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(d))",
    "Retroact": "torch.autograd.grad(output, feature) for a feature map's gradient",
    "PSNR": "10 * log10(peak ** 2 / mse) on the outputs",
    "SSIM": "an SSIM of your choice on the outputs",
}


def __getattr__(name: str) -> Any:
    retire("dualtrain.compat.nebulae.astrobase.dock", name, _RETIRED)
