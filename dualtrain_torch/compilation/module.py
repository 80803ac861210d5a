"""A module's forward that runs under the rung its ladder chose, per mode and input signature.

`accelerate` (`dualtrain_torch.compilation`) installs an `AcceleratedForward` as the module's
``forward``, an instance attribute: ``nn.Module.__call__`` (hooks included) still runs it.
Here too: what tells two calls apart (`signature`: the inputs' structure, dtypes, shapes,
devices, gradient and autocast modes, submodules in another mode than the root's), which
calls it leaves alone (`foreign`: other tracers and transforms), and what a decision
depends on besides the inputs (`structure`: the model, the code of its classes, threads,
versions).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dualtrain.accelerate.dispatch import Decider, Probation
from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import Explanation
from dualtrain_torch.compilation.keys import autocast, foreign, modes, signature, structure, trains
from dualtrain_torch.compilation.probe import Snapshot
from dualtrain_torch.compilation.rungs import rung_trials

__all__ = ["AcceleratedForward"]


_QUICK_KEPT = 256  # quick keys remembered per module


def _onnx_exporting_check() -> Callable[[], bool]:
    """Whether an ONNX export is under way, read from its two flags when they can be found.

    ``torch.onnx.is_in_onnx_export`` imports both flags' modules on every call (1.4 µs,
    a third of a quick key); read where they live, the check costs a tenth of that. A torch
    whose flags live elsewhere gets the public function.
    """
    try:
        from torch.onnx._internal.exporter import _flags
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
    except ImportError:
        return torch.onnx.is_in_onnx_export
    if not (hasattr(GLOBALS, "in_onnx_export") and hasattr(_flags, "_is_onnx_exporting")):
        return torch.onnx.is_in_onnx_export
    return lambda: bool(GLOBALS.in_onnx_export or _flags._is_onnx_exporting)


_onnx_exporting = _onnx_exporting_check()
# Autocast's per-device reading costs 0.7 µs; whether any is on, 0.1 µs.
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
# Read per call by the quick key: bound once (each attribute walk is 30-60 ns).
_Tensor = torch.Tensor
_strided = torch.strided
_grad_enabled = torch.is_grad_enabled
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_training = operator.attrgetter("training")
_is_compiling = torch.compiler.is_compiling
_is_tracing = torch._C._is_tracing


def _tensor_guard_maker() -> Callable[[tuple[Any, ...]], Any] | None:
    """Builds dynamo's C++ check of tensors against the ones given, when torch has it.

    `TensorGuards.check` compares each tensor's exact type, dispatch keys (functorch
    wrappers and autocast included), dtype, device, shape, strides and requires_grad with
    the recorded ones in 0.2 µs, where reading the same facts from Python costs 0.6 µs a
    tensor. It is what torch.compile's own cache checks. A torch without it gets no lane.
    """
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None

    def make(args: tuple[Any, ...]) -> Any:
        # One list of sizes (strides) per tensor, each an int: static, checked for equality
        # (None would mark a dynamic dimension). The stub types a single tensor's list.
        sizes: Any = [list(x.shape) for x in args]
        strides: Any = [list(x.stride()) for x in args]
        return TensorGuards(*args, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)

    return make


_tensor_guard = _tensor_guard_maker()


class _Lane:
    """A signature decided for eager for good, and the cheapest check that a call has it."""

    __slots__ = ("count", "grad", "guard", "runner", "training")

    def __init__(self, args: tuple[Any, ...], training: bool, runner: Callable[..., Any]) -> None:
        assert _tensor_guard is not None
        self.count, self.training, self.grad = len(args), training, _grad_enabled()
        self.guard, self.runner = _tensor_guard(args), runner


class AcceleratedForward:
    """A module's ``forward`` that runs under the rung its ladder chose for each call's mode.

    Not made directly: `accelerate` installs one. Pickles as its settings (the decisions
    are made again, or read from the decision cache, after unpickling).
    """

    def __init__(
        self,
        module: nn.Module,
        backends: Any,
        patch_backprop: bool | dict[str, Any],
        options: LadderOptions,
    ) -> None:
        self.module = module
        self.backends, self.patch_backprop, self.options = backends, patch_backprop, options
        self.decider = Decider("torch", backends, options)
        self.patched = False
        self._bound: Callable[..., Any] | None = None
        # quick key -> (mode, signature), or the bound forward itself once the decision for
        # that signature is eager for good (no decision leaves eager: it is the last rung).
        self._quick: dict[Any, tuple[str, str] | Callable[..., Any]] = {}
        self._tree: list[nn.Module] | None = None  # the submodules, for the quick key
        # The quick key -> its lane, and the lane the last call served by one took.
        self._lanes: dict[Any, _Lane] = {}
        self._lane: _Lane | None = None
        self._lock = threading.RLock()

    # The module holds this object and this object the module: pickle and deepcopy see a
    # cycle they handle, because the module comes back as state, after both exist.
    def __getstate__(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "backends": self.backends,
            "patch_backprop": self.patch_backprop,
            "options": self.options,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]  # the settings; decisions start afresh

    def eager(self) -> Callable[..., Any]:
        """The module's own forward, bound (what every rung computes)."""
        if self._bound is None:
            self._bound = type(self.module).forward.__get__(self.module)
        return self._bound

    def explain(self) -> Explanation:
        """What was tried, chosen and rejected for each mode and signature, and why."""
        return self.decider.explain()

    def _patch(self) -> None:
        # At the first call, not at accelerate(): a decorated class's subclass finishes
        # building its layers after the decorated __init__ returns.
        self.patched = True
        from dualtrain_torch.sparse_backprop import approximations, patch_linears

        if self.patch_backprop:
            settings = self.patch_backprop if isinstance(self.patch_backprop, dict) else {}
            patch_linears(self.module, **settings)
            self._bound = None  # a root Linear changed class
        # Read from the layers: a model patched before accelerate() is approximate too.
        self.decider.approximations = [a.describe() for a in approximations(self.module)]

    def _quick_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A hashable key for the common call (plain tensors by position), or None.

        Built from the same facts as `signature` (and `foreign`'s checks), without the text:
        formatting a signature per call cost ~200 us, more than a small MLP's forward.
        """
        if kwargs or _is_compiling() or _is_tracing():
            return None
        if _onnx_exporting():
            return None
        root = self.module.training
        parts: list[Any] = [root, _grad_enabled(), autocast() if _any_autocast() else ""]
        for x in args:
            if type(x) is not _Tensor or _functorch_wrapped(x):
                return None
            parts.append((x.shape, x.dtype, x.device, x.requires_grad))
        tree = self._tree
        if tree is None:
            tree = self._tree = list(self.module.modules())  # refreshed by the slow path
        # Every submodule in the root's mode (the common case), read in C: all() over map.
        alike = all(map(_training, tree)) if root else not any(map(_training, tree))
        parts.append("" if alike else modes(self.module))
        return tuple(parts)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The lane: the last signature served eager for good, checked in C (see `_Lane`),
        # with the facts the tensor check does not cover (modes, tracers) read as the quick
        # key reads them. A call that misses it takes the quick key.
        lane, tree = self._lane, self._tree
        if (
            lane is not None
            and tree is not None
            and not kwargs
            and len(args) == lane.count
            and _grad_enabled() is lane.grad
            and not _any_autocast()
            and not _is_compiling()
            and not _is_tracing()
            and not _onnx_exporting()
            # Every module in the lane's mode, the root included (the tree holds it).
            and (all(map(_training, tree)) if lane.training else not any(map(_training, tree)))
            and lane.guard.check(*args)
        ):
            return lane.runner(*args)
        quick = self._quick_key(args, kwargs)
        seen = None if quick is None else self._quick.get(quick)
        if seen is None:
            return self._decided(quick, args, kwargs)
        if not isinstance(seen, tuple):  # eager for good: no snapshot, nothing to fall from
            self._take_lane(quick, args, seen)
            return seen(*args, **kwargs)
        mode, key = seen
        runner = self.decider.known(mode, key)
        assert runner is not None  # a quick entry is made once its signature is decided
        if runner is self._bound:  # eager since the quick entry was made: serve it directly
            self._quick[quick] = runner
            return runner(*args, **kwargs)
        return self._run(runner, mode, key, args, kwargs)

    def _take_lane(self, quick: Any, args: tuple[Any, ...], runner: Callable[..., Any]) -> None:
        """Points the lane at `quick`'s signature (decided eager for good), made once each."""
        if _tensor_guard is None or _any_autocast() or quick[-1] != "":
            return  # the lane checks that every module is in the root's mode, and no autocast
        if not all(type(x) is _Tensor and x.layout is _strided for x in args):
            return  # sparse and nested tensors have no strides to check
        lane = self._lanes.get(quick)
        if lane is None:
            if len(self._lanes) >= _QUICK_KEPT:
                self._lanes.clear()
            try:
                lane = _Lane(args, quick[0], runner)
            except Exception:  # a tensor the C++ check cannot record: the quick key serves
                return
            self._lanes[quick] = lane
        self._lane = lane

    def _decided(self, quick: Any, args: Any, kwargs: Any) -> Any:
        """A call whose signature the quick table does not hold: keyed in full, decided."""
        module = self.module
        if foreign(args, kwargs):
            return self.eager()(*args, **kwargs)
        self._tree = None  # a submodule added since is seen from the next call on
        self._lane = None
        mode = "train" if module.training else "eval"
        key = signature(args, kwargs) + modes(module)
        runner = self.decider.known(mode, key)
        if runner is None:
            with self._lock:
                if not self.patched:
                    self._patch()
                runner = self.decider.known(mode, key)
                if runner is None:
                    eager = self.eager()
                    runner = self.decider.decide(
                        mode,
                        key,
                        {**structure(module), "approximate": self.decider.approximations},
                        lambda names: list(
                            rung_trials(names, module, eager, args, kwargs, self.options.clock)
                        ),
                    )
        if quick is not None:
            if len(self._quick) >= _QUICK_KEPT:
                self._quick.clear()  # signatures beyond the cap: keep the table bounded
                self._lanes.clear()
                self._lane = None
            self._quick[quick] = runner if runner is self._bound else (mode, key)
        return self._run(runner, mode, key, args, kwargs)

    def _run(self, runner: Callable[..., Any], mode: str, key: str, args: Any, kwargs: Any) -> Any:
        if type(runner) is Probation:  # what this call runs, after any climb that is due
            runner = runner.serving()
        if runner is self._bound or self.decider.serves_eager(runner):
            return runner(*args, **kwargs)
        # Buffers, attributes and RNG: a failing rung must leave no trace for eager (in
        # training; an evaluation forward moves none of them, `trains`).
        snapshot = Snapshot(self.module, attributes=True) if trains(self.module) else None
        try:
            return runner(*args, **kwargs)
        except Exception as error:
            if snapshot is not None:
                snapshot.restore()
            eager = self.eager()
            out = eager(*args, **kwargs)  # eager failing too is the user's error, raised
            with self._lock:
                self.decider.fall_back(mode, key, error)
            return out

    def __repr__(self) -> str:
        return f"AcceleratedForward({type(self.module).__name__}, backends={self.decider.backends})"
