"""The torch rungs as ladder trials: how each builds the runner of a module's forward.

PYTORCH is the module's own forward; TORCH_COMPILE and CUDA_GRAPHS compile it with
``torch.compile``; CHANNELS_LAST hands 2-D convolutions their 4-D inputs NHWC;
ONNXRUNTIME exports the eval-mode forward to an ONNX Runtime session (ORTModule in training,
when onnxruntime-training is installed); RAMMER, TORCHSCRIPT and COMPILED_STEP (a step, not
a forward: `TrainingLearner`) are reported unavailable. What a trial returns and how it
stays free of side effects: `dualtrain_torch.compilation.probe`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from dualtrain.accelerate.ladder import UnavailableError
from dualtrain_torch.compilation.cache import use_disk_cache
from dualtrain_torch.compilation.keys import mixed_modes, trains
from dualtrain_torch.compilation.probe import (
    Frozen,
    Snapshot,
    fresh_inputs,
    probe_results,
    timed_forward,
)

__all__ = ["ForwardTrial", "compile_apart", "conv_layers", "onnx_available", "rung_trials"]

Forward = Callable[..., Any]


def conv_layers(module: nn.Module) -> list[str]:
    """Names of the 2-D convolutions in `module` (channels-last concerns them alone)."""
    return [n for n, m in module.named_modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]


@contextlib.contextmanager
def _no_compile_warnings() -> Iterator[None]:
    # inductor warns about its own tuning choices on CPU; the ladder reports what matters.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class ForwardTrial:
    """One rung of a module's forward, on the batch ``(args, kwargs)``.

    Args:
        name: the rung.
        module: the model (its forward is `eager`).
        eager: the module's own forward (bound), what every rung computes.
        args, kwargs: the batch.
        clock: what times a step (`LadderOptions.clock`).
    """

    def __init__(
        self,
        name: str,
        module: nn.Module,
        eager: Forward,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.name = name
        self.module, self.eager = module, eager
        self.args, self.kwargs = args, kwargs
        self.clock = clock
        self._runner: Forward | None = None
        self._adopted = False
        self._snapshot = Snapshot(module, attributes=True)

    # -- the Trial protocol -----------------------------------------------------------

    def adopt(self, runner: Forward) -> None:
        """Serves `runner`, this rung's already built forward (`build` then does nothing)."""
        self._runner, self._adopted = runner, True

    def build(self) -> None:
        if self._adopted:
            return
        try:
            self._runner = _BUILDERS[self.name](self)
        finally:
            # A builder may run the forward (the ONNX export traces it): whether it then
            # succeeds, is unavailable or fails, it leaves no trace (RNG, buffers).
            self._snapshot.restore()

    def fresh(self) -> tuple[Any, dict[str, Any]]:
        """The batch, copied anew (see `fresh_inputs`): what each run of a trial reads."""
        return fresh_inputs(self.args, self.kwargs)

    def runner(self) -> Forward:
        assert self._runner is not None, "build() first"
        return self._runner

    def check(self) -> tuple[list[str], list[np.ndarray]]:
        run = self.runner()
        args, kwargs = self.fresh()
        try:
            with _no_compile_warnings():
                return probe_results(self.module, lambda: run(*args, **kwargs), (args, kwargs))
        finally:
            self._snapshot.restore()

    def step(self) -> float:
        """One step; returns its seconds: what a real call under this rung costs.

        That is without the copying of inputs and the restoring that only a trial does.
        """
        run = self.runner()
        args, kwargs = self.fresh()
        try:
            with _no_compile_warnings():
                start = self.clock()
                if self.name != "PYTORCH" and trains(self.module):
                    # A real call under a candidate snapshots buffers and RNG first, so that
                    # a failing rung can hand the call to eager (`AcceleratedForward`).
                    Snapshot(self.module, attributes=True)
                timed_forward(lambda: run(*args, **kwargs), self.module)
                return self.clock() - start
        finally:
            self._snapshot.restore()

    def release(self) -> None:
        self._runner = None  # drops the compiled code with the last reference


def _eager(trial: ForwardTrial) -> Forward:
    return trial.eager


def _compiled(trial: ForwardTrial, mode: str | None = None) -> Forward:
    if not hasattr(torch, "compile"):
        raise UnavailableError("this torch has no torch.compile")
    # fallback_random: random ops (dropout) draw from torch's generator as eager does, so
    # the compiled forward is checkable against eager and keeps eager's RNG stream.
    options: dict[str, Any] = {"fallback_random": True}
    if mode == "reduce-overhead":
        options["triton.cudagraphs"] = True
    return compile_apart(trial.eager, options)


def compile_apart(fn: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
    """``torch.compile(fn, dynamic=False)`` behind a function whose code object is its own.

    Dynamo keeps what it compiled on the code object of the function it wraps, and wraps
    every bound method in the same one (its ``inner``): the trials of every signature of
    every accelerated module shared one cache, and the 9th compile met its
    ``recompile_limit`` (8), ran eager under the rung's name and warned on stderr.
    """
    use_disk_cache()  # before the first compile: its programs kept beside the verdicts

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    own = types.FunctionType(
        call.__code__.replace(), call.__globals__, call.__name__, None, call.__closure__
    )
    return torch.compile(own, dynamic=False, options=options)


def _cuda_graphs(trial: ForwardTrial) -> Forward:
    devices = {p.device.type for p in trial.module.parameters()} | {
        x.device.type
        for x in pytree.tree_leaves((trial.args, trial.kwargs))
        if isinstance(x, torch.Tensor)
    }
    if devices != {"cuda"}:
        raise UnavailableError(f"needs the model and inputs on CUDA; found {sorted(devices)}")
    return _compiled(trial, "reduce-overhead")


def _to_channels_last(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    return value


def _channels_last(trial: ForwardTrial) -> Forward:
    if not conv_layers(trial.module):
        raise UnavailableError("no 2-D convolution to lay out channels-last")
    four_d = [
        x
        for x in pytree.tree_leaves((trial.args, trial.kwargs))
        if isinstance(x, torch.Tensor) and x.dim() == 4
    ]
    if not four_d:
        raise UnavailableError("no 4-D input to lay out channels-last")
    # Inputs only: oneDNN lays the weights out per call at no measurable cost (input-only
    # and weights-too timed the same, training and eval), and parameters keep the strides
    # DDP's gradient buckets were built on (re-laid-out weights got wrong gradients there).
    eager = trial.eager

    def forward(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = pytree.tree_map(_to_channels_last, (args, kwargs))
        return eager(*args, **kwargs)

    return forward


class _EagerRoot(nn.Module):
    # The exporter calls the module it is given; this one runs the model's own forward, so
    # the accelerated wrapper is not re-entered while exporting.
    def __init__(self, module: nn.Module, eager: Forward) -> None:
        super().__init__()
        self.inner = module
        self._eager = eager
        # This root's flag alone: .train() would recurse and overwrite the model's own mix.
        self.training = module.training

    def forward(self, *args: Any) -> Any:
        return self._eager(*args)


@contextlib.contextmanager
def _modes_kept(module: nn.Module) -> Iterator[None]:
    # The exporter sets the training flags from the root's and resets them the same way,
    # recursively: a model whose submodules are in mixed modes would come back uniform.
    modes = [(m, m.training) for m in module.modules()]
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _onnxruntime(trial: ForwardTrial) -> Forward:
    module = trial.module
    if module.training:
        try:
            ort_module = importlib.import_module("onnxruntime.training.ortmodule").ORTModule
        except (ImportError, AttributeError):
            raise UnavailableError(
                "training needs ORTModule from the onnxruntime-training package, not installed"
            ) from None
        wrapped = ort_module(_EagerRoot(module, trial.eager))
        return lambda *args, **kwargs: wrapped(*args, **kwargs)
    if not onnx_available():
        raise UnavailableError("needs onnxruntime and onnx: pip install 'dualtrain[onnx]'")
    if trial.kwargs or not all(isinstance(a, torch.Tensor) for a in trial.args):
        raise UnavailableError("ONNX export takes positional tensor inputs only")
    needs_grad = any(p.requires_grad for p in module.parameters()) or any(
        a.requires_grad for a in trial.args
    )
    if torch.is_grad_enabled() and needs_grad:
        raise UnavailableError(
            "ONNX Runtime computes no gradients: evaluation under torch.no_grad() uses it"
        )
    devices = {a.device.type for a in trial.args} | {p.device.type for p in module.parameters()}
    if devices - {"cpu"}:
        raise UnavailableError(f"CPU tensors only; found {sorted(devices)}")
    if any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda")):
        raise UnavailableError("autocast is on: an ONNX Runtime session computes as exported")
    training = mixed_modes(module)
    if training:
        raise UnavailableError(
            f"submodules in training mode during evaluation ({', '.join(training[:3])}): "
            "an exported graph would run them in evaluation mode, or draw its own random numbers"
        )
    eager = trial.eager
    before = Frozen(module)
    with torch.no_grad():
        _, spec = pytree.tree_flatten(eager(*trial.fresh()[0]))
    if not before.same():
        # A graph runs no Python: what the forward changes besides its outputs (a call
        # counter, a cache) it would change once, while tracing.
        raise UnavailableError(
            "the forward changes the model's attributes or weights; an exported graph would not"
        )
    session: list[Any] = []

    def export(example: tuple[Any, ...]) -> None:
        import io
        import warnings

        import onnxruntime as ort

        buffer = io.BytesIO()
        # Copies of the example: the trace runs the forward, which may write into them.
        example = fresh_inputs(example, {})[0]
        with (
            _modes_kept(module),
            warnings.catch_warnings(record=True) as caught,
            torch.no_grad(),
        ):
            warnings.simplefilter("always")
            root = _EagerRoot(module, eager)
            torch.onnx.export(root, example, buffer, dynamo=False)  # type: ignore[arg-type]
        frozen = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
        if frozen:
            # A traced graph keeps the branch this batch took (nebulgym's TorchScript bug).
            raise UnavailableError(
                "the forward has data-dependent Python control flow, which a traced graph "
                f"would freeze ({str(frozen[0].message).splitlines()[0][:160]})"
            )
        settings = ort.SessionOptions()
        settings.intra_op_num_threads = torch.get_num_threads()
        settings.inter_op_num_threads = 1
        built = ort.InferenceSession(
            buffer.getvalue(), settings, providers=["CPUExecutionProvider"]
        )
        session[:] = [built, [i.name for i in built.get_inputs()], Frozen(module)]

    export(trial.args)
    stale = [False]  # whether the previous call found the graph stale

    def forward(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != len(session[1]):
            raise TypeError("the ONNX session takes the positional inputs it was exported with")
        if torch.is_grad_enabled() and (
            any(p.requires_grad for p in module.parameters())
            or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        ):
            # Parameters unfrozen after the choice (gradients in eval mode, fine-tuning):
            # the session computes no gradients, eager does.
            raise RuntimeError("gradients are needed now; ONNX Runtime computes none")
        if session[2].same():
            stale[0] = False
        else:
            if stale[0]:
                # Exporting on every call costs far more than eager: hand over to eager.
                raise RuntimeError(
                    "the model's attributes or weights changed on two calls in a row; an "
                    "exported graph cannot follow them"
                )
            stale[0] = True
            export(args)
        feeds = {name: a.detach().numpy() for name, a in zip(session[1], args, strict=True)}
        outs = session[0].run(None, feeds)
        return pytree.tree_unflatten([torch.from_numpy(o) for o in outs], spec)

    return forward


def _unavailable(reason: str) -> Callable[[ForwardTrial], Forward]:
    def build(trial: ForwardTrial) -> Forward:
        raise UnavailableError(reason)

    return build


_BUILDERS: dict[str, Callable[[ForwardTrial], Forward]] = {
    "PYTORCH": _eager,
    "TORCH_COMPILE": _compiled,
    "CUDA_GRAPHS": _cuda_graphs,
    "CHANNELS_LAST": _channels_last,
    "ONNXRUNTIME": _onnxruntime,
    "COMPILED_STEP": _unavailable(
        "compiles a whole training step: TrainingLearner(model, optimizer=...).step uses it"
    ),
    "RAMMER": _unavailable(
        "Rammer (nnfusion) has no Python package; it builds from source, CUDA only"
    ),
    "TORCHSCRIPT": _unavailable(
        "torch.jit.trace froze train/eval mode and data-dependent branches; TORCH_COMPILE "
        "replaces it"
    ),
}


def rung_trials(
    names: Sequence[str],
    module: nn.Module,
    eager: Forward,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    clock: Callable[[], float] = time.perf_counter,
) -> list[ForwardTrial]:
    """Trials for rungs `names` of `module`'s forward on one batch, timed by `clock`."""
    return [ForwardTrial(name, module, eager, args, kwargs, clock) for name in names]


def onnx_available() -> bool:
    """Whether ONNX Runtime and the exporter's packages are importable."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))
