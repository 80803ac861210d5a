"""What tells two calls apart and what a decision depends on, for torch.

`signature`: the inputs' structure, dtypes, shapes and devices, with the gradient mode,
the autocast in force and the submodules in another mode than the root's (`modes`,
`mixed_modes`); `foreign`: the calls another tracer or transform makes, which run the
plain forward; `structure` and `code`: the model, the code of its classes (a cached
decision is trusted, so an edited forward must be another key), threads and versions;
`trains`: whether any part is in training mode (only then does a call snapshot).
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from dualtrain.accelerate.decisions import code_digest, function_digest

__all__ = [
    "autocast",
    "code",
    "foreign",
    "mixed_modes",
    "modes",
    "signature",
    "structure",
    "trains",
]


def trains(module: nn.Module) -> bool:
    """Whether any part of `module` is in training mode: only then can a forward move state.

    A real call under a candidate rung snapshots buffers, attributes and RNG first, so that
    a failing rung can hand the call to eager with no trace; in evaluation (every flag
    off) the forward moves no BatchNorm statistic and draws no dropout, and the snapshot,
    which costs more than a small model's forward on a GPU, is skipped.
    """
    return any(m.training for m in module.modules())


def mixed_modes(module: nn.Module) -> list[str]:
    """Names of the submodules whose training flag differs from the root's.

    Dropout left on in evaluation (Monte Carlo dropout) or BatchNorm frozen in training:
    the root's ``training`` alone does not say what the forward computes.
    """
    return [n for n, m in module.named_modules() if m.training != module.training]


def _leaf_signature(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        grad = ",grad" if x.requires_grad else ""
        return f"{str(x.dtype)[6:]}{list(x.shape)}@{x.device}{grad}"
    if x is None or isinstance(x, (bool, int, float, str)):
        return repr(x)
    return type(x).__qualname__


def autocast() -> str:
    """``""``, or the autocast in force, e.g. `` autocast[cpu:bfloat16]``.

    Autocast changes what the forward computes (dtypes, precision): part of the signature.
    """
    found = [
        f"{device}:{str(torch.get_autocast_dtype(device))[6:]}"
        for device in ("cpu", "cuda")
        if torch.is_autocast_enabled(device)
    ]
    return f" autocast[{','.join(found)}]" if found else ""


def signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The input signature: the tree's structure, each tensor's dtype, shape and device.

    And the modes in force around the call: gradients, autocast.
    """
    leaves, spec = pytree.tree_flatten((args, kwargs))
    grad = ("" if torch.is_grad_enabled() else " no_grad") + autocast()
    # sha256, not hash(): str hashes change with each process's seed, and the signature is
    # part of the decision cache's key, which a second run must find.
    tree = hashlib.sha256(str(spec).encode()).hexdigest()[:12]
    return f"({', '.join(_leaf_signature(x) for x in leaves)}){grad} {tree}"


_PLAIN = (torch.Tensor, nn.Parameter)


def foreign(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether another tracer or transform runs this call: then the plain forward runs.

    ``torch.compile`` (ours or the user's), ``torch.jit.trace``, ``torch.onnx.export``,
    ``torch.fx`` (proxies), ``torch.func`` transforms (``vmap``, ``grad``: wrapped tensors)
    and tensor subclasses (fake, distributed) each see the forward as code to record; a
    trial, a snapshot or an ONNX session run inside them would be recorded, or crash.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return True
    for x in pytree.tree_leaves((args, kwargs)):
        if isinstance(x, torch.fx.Proxy):
            return True
        if isinstance(x, torch.Tensor) and (
            type(x) not in _PLAIN or torch._C._functorch.is_functorch_wrapped_tensor(x)
        ):
            return True
    return False


def modes(module: nn.Module) -> str:
    """``""`` when every submodule shares the root's training flag, else which do not.

    Appended to the input signature: Monte Carlo dropout (dropout on in evaluation) or
    BatchNorm frozen in training computes something else than the root's mode says, so it
    is decided (and cached) apart, and switching a submodule later is a new decision.
    """
    root = module.training
    stack = [module]
    while stack:  # the common case, every flag the root's: faster than modules()
        m = stack.pop()
        if m.training != root:
            break
        stack.extend(c for c in m._modules.values() if c is not None)
    else:
        return ""
    other = "eval" if root else "train"
    return f" [{other}: {', '.join(mixed_modes(module))}]"


_CODE: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()


def _class_code(cls: type) -> str:
    # The compiled code of the methods a class and its bases define (torch's own classes
    # change only with torch's version, which the key holds).
    known = _CODE.get(cls)
    if known is not None:
        return known
    digest = hashlib.sha256()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        for name, value in sorted(vars(klass).items()):
            function = getattr(value, "fget", getattr(value, "__func__", value))
            if getattr(function, "__code__", None) is not None:
                digest.update(name.encode())
                digest.update(code_digest(function).encode())
    _CODE[cls] = known = digest.hexdigest()[:16]
    return known


def code(objects: Any) -> list[str]:
    """Fingerprints of the code behind `objects`: a module's classes, or a function.

    A decision holds for the code that was verified: an edited ``forward`` (or a helper
    method) with the same class name and layers is decided again, not read from the
    cache. Code outside the classes (a module-level function the forward calls) is not
    seen.
    """
    if isinstance(objects, nn.Module):
        classes = dict.fromkeys(type(m) for m in objects.modules())
        return [f"{c.__qualname__}:{_class_code(c)}" for c in classes]
    # A function by its code and closure; a partial or a callable object by what it calls
    # and the attributes it holds.
    return [function_digest(objects)]


def structure(module: nn.Module) -> dict[str, Any]:
    """What a decision depends on besides the inputs: the model, its code, threads, versions."""
    return {
        "class": f"{type(module).__module__}.{type(module).__qualname__}",
        "code": code(module),
        "repr": repr(module),
        "params": [
            (n, list(p.shape), str(p.dtype), str(p.device)) for n, p in module.named_parameters()
        ],
        "buffers": [(n, list(b.shape), str(b.dtype)) for n, b in module.named_buffers()],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
