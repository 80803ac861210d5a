"""nebulgym's accelerate_model for torch: a verified compile ladder on a module's forward.

`accelerate(module)` changes one instance in place and returns it: its ``forward`` becomes
an `AcceleratedForward`, an instance attribute, so ``nn.Module.__call__`` (hooks included)
still runs, ``isinstance``, ``state_dict`` keys, ``.to()``, pickling and DDP wrapping are
untouched, and the class stays the user's. On the first call in each mode (train / eval)
and input signature, the rungs are tried on that batch from one snapshot and the fastest
verified one is kept (`dualtrain.accelerate.dispatch`); ``explain()`` says what happened.
`accelerate_model` / `patch_torch_module` do the same for every instance of a class.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

from torch import nn

from dualtrain.accelerate.options import LadderOptions
from dualtrain.accelerate.report import Explanation
from dualtrain.accelerate.topk import resolve_k
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain_torch.compilation.module import AcceleratedForward

__all__ = ["AcceleratedForward", "accelerate", "accelerate_model", "explain", "patch_torch_module"]

T = TypeVar("T")


def _check_patch_backprop(value: Any) -> None:
    # The layers are patched at the first call (a decorated subclass adds layers after the
    # decorated __init__): a bad dict must fail here, not then.
    expected = 'a bool or a dict with "k" (an int >= 1) or "ratio" (in (0, 1])'
    if isinstance(value, bool):
        return
    if not isinstance(value, dict) or not set(value) <= {"k", "ratio"}:
        raise bad_argument("patch_backprop", value, expected)
    try:
        resolve_k(1, **value)
    except ArgumentError as error:  # chained: it says which of k and ratio, and why
        raise bad_argument("patch_backprop", value, expected) from error


def accelerate(
    module: nn.Module,
    backends: Sequence[Any] | str | None = None,
    patch_backprop: bool | dict[str, Any] = False,
    **options: Any,
) -> nn.Module:
    """Accelerates `module` in place through a verified ladder of rungs; returns it.

    Args:
        module: any ``nn.Module`` (a realized Craft too).
        backends: rungs in order of preference (`dualtrain.accelerate.RUNGS`); None tries
            CHANNELS_LAST, TORCH_COMPILE, ONNXRUNTIME, CUDA_GRAPHS and PYTORCH. Eager
            (PYTORCH) closes the ladder. nebulgym's names (and its enum's members) work.
        patch_backprop: False (exact, the default), True (meProp top-k backprop on every
            Linear, k = 4% of its outputs, at least 1), or a dict ``{"k": ...}`` /
            ``{"ratio": ...}``. Approximate: ``explain()`` lists each layer.
        **options: `LadderOptions` fields (rtol, atol, compile_budget, warm_steps,
            min_speedup, max_signatures, cache, clock).

    Returns:
        `module` itself; ``module.forward.explain()`` (or `explain(module)`) reports.
    """
    if not isinstance(module, nn.Module):
        raise bad_argument("module", module, "a torch.nn.Module instance")
    _check_patch_backprop(patch_backprop)
    settings = LadderOptions.from_keywords(options)
    current = module.__dict__.get("forward")
    if not isinstance(current, AcceleratedForward):
        current = None
    if (
        current is not None
        and not options
        and current.backends == backends
        and (not current.patched or patch_backprop == current.patch_backprop)
    ):
        current.patch_backprop = patch_backprop  # the latest call's, applied at the next call
        return module
    # Validates backends before anything changes.
    forward = AcceleratedForward(module, backends, patch_backprop, settings)
    if current is not None and current.patched and current.patch_backprop:
        # The layers the previous settings made approximate: exact again, then the new
        # forward patches what its own settings say (and explain() reports that).
        from dualtrain_torch.sparse_backprop import unpatch_linears

        unpatch_linears(module)
    module.forward = forward
    return module


def explain(module: nn.Module) -> Explanation:
    """The ladder's report for an accelerated `module`."""
    forward = module.__dict__.get("forward") if isinstance(module, nn.Module) else None
    if not isinstance(forward, AcceleratedForward):
        raise bad_argument("module", type(module).__name__, "a module passed to accelerate()")
    return forward.explain()


# ids of the instances whose decorated __init__ is running (a subclass's super().__init__
# chain runs several); the outermost one accelerates.
_building: dict[int, int] = {}
_building_lock = threading.Lock()


def accelerate_model(
    patch_backprop: Any = False, backends: Sequence[Any] | str | None = None, **options: Any
) -> Any:
    """Class decorator (nebulgym's): every instance of the class is accelerated when built.

    ``@accelerate_model(backends=[...], patch_backprop=False)``, or bare
    ``@accelerate_model``. The class keeps its name, methods and pickling; instances are
    accelerated at the end of the outermost ``__init__``. Applied to a module instance it
    is `accelerate`.

    Args:
        patch_backprop: as in `accelerate` (first, as nebulgym's); or, used bare, the class.
        backends: as in `accelerate`.
        **options: `LadderOptions` fields.

    Raises:
        ArgumentError: a bad argument, when the decorator is made (before any instance).
    """
    if isinstance(patch_backprop, nn.Module):
        return accelerate(patch_backprop, backends, False, **options)
    if isinstance(patch_backprop, type):
        return _decorate(patch_backprop, backends, False, options)
    LadderOptions.from_keywords(options)
    _check_patch_backprop(patch_backprop)
    from dualtrain.accelerate.rungs import parse_backends

    parse_backends(backends, "torch")

    def decorator(target: Any) -> Any:
        if isinstance(target, nn.Module):
            return accelerate(target, backends, patch_backprop, **options)
        return _decorate(target, backends, patch_backprop, options)

    return decorator


patch_torch_module = accelerate_model  # nebulgym's first name for the decorator


def _decorate(cls: type[T], backends: Any, patch_backprop: Any, options: dict[str, Any]) -> type[T]:
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise bad_argument("cls", cls, "a torch.nn.Module subclass (or an instance)")
    original = cls.__dict__.get("__init__", cls.__init__)
    original = getattr(original, "__dualtrain_wrapped_init__", original)

    @functools.wraps(original)
    def init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        with _building_lock:
            depth = _building.get(id(self), 0)
            _building[id(self)] = depth + 1
        try:
            original(self, *args, **kwargs)
        finally:
            with _building_lock:
                if depth:
                    _building[id(self)] = depth
                else:
                    del _building[id(self)]
        if depth == 0:
            accelerate(self, backends, patch_backprop, **options)

    init.__dualtrain_wrapped_init__ = original  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
