"""The rungs of each framework's ladder, and reading a user's ``backends=`` argument.

A rung is one way to run the same computation (eager, a compiler, a layout). The ladder
tries the rungs a user names, in order, verifies each against the eager rung and keeps the
fastest verified one (`dualtrain.accelerate.ladder`). The eager rung is always the last
resort: it is appended when a user leaves it out, so there is always something to run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from dualtrain import backends
from dualtrain.errors import bad_argument

__all__ = [
    "DEFAULTS",
    "EAGER",
    "FOLLOWS",
    "PRIORS",
    "RUNGS",
    "STARTS",
    "Ladder",
    "parse_backends",
]


@dataclasses.dataclass(frozen=True)
class Ladder:
    """One framework's compile ladder, as its adapter declares it (``dualtrain_<name>.policy``).

    Attributes:
        rungs: rung -> what it is, in the documentation's order.
        eager: the reference rung, the ladder's last resort.
        start: the cheapest correct fast path a job starts on, before any candidate earns
            its trial (`dualtrain.accelerate.payback`).
        defaults: what ``backends=None`` tries.
    """

    rungs: dict[str, str]
    eager: str
    start: str
    defaults: tuple[str, ...]


# Each framework's ladder, by name (each adapter declares its own `Ladder`).
RUNGS: Mapping[str, dict[str, str]] = backends.Declared("LADDER", "rungs")
EAGER: Mapping[str, str] = backends.Declared("LADDER", "eager")
STARTS: Mapping[str, str] = backends.Declared("LADDER", "start")
DEFAULTS: Mapping[str, tuple[str, ...]] = backends.Declared("LADDER", "defaults")

# rung -> (seconds to build it, speed-up over the start rung) assumed until this machine has
# measured the rung's builds (`payback.CompileCosts`). From bench_accelerate on a CPU core:
# torch.compile of a small CNN 10-70 s for 1.3-1.4x in training; ONNX Runtime 1-3 s for
# 3-4x in evaluation; a jit of a training step ~1 s; donation saves a copy (a few percent).
# Rungs that are never available here (CUDA-only, retired) cost nothing to find out.
PRIORS: dict[str, tuple[float, float]] = {
    "CHANNELS_LAST": (0.2, 1.1),
    "TORCH_COMPILE": (30.0, 1.3),
    "COMPILED_STEP": (40.0, 1.3),
    "CUDA_GRAPHS": (30.0, 1.5),
    "ONNXRUNTIME": (3.0, 2.0),
    "RAMMER": (0.0, 2.0),
    "TORCHSCRIPT": (0.0, 2.0),
    "PYTORCH": (0.0, 1.0),
    "JIT_DONATE": (1.0, 1.05),
    "JIT": (1.0, 3.0),
    "EAGER": (0.0, 1.0),
}

# rung -> what a call on it follows of what changed since the rung was built (explain()
# prints it under the chosen rung; docs/acceleration.md, "What each rung follows").
FOLLOWS: dict[str, str] = {
    "PYTORCH": "everything: it is the module's own forward",
    "CHANNELS_LAST": "everything: the module's own forward on NHWC inputs",
    "TORCH_COMPILE": "what torch.compile's guards check: parameters and buffers (live), "
    "attributes, module-level values and closures the traced code reads",
    "CUDA_GRAPHS": "what torch.compile's guards check; parameters are read in place",
    "COMPILED_STEP": "what torch.compile's guards check: parameters and optimizer state live",
    "ONNXRUNTIME": "parameters and buffers by value (.data writes too), module attributes, "
    "hooks and modes, and module-level values and closure cells the forwards read directly "
    "(re-exported on a change); not a value read inside a function the forward calls, nor "
    "a field inside a custom object",
    "JIT_DONATE": "its arguments only: a value read from outside them is a constant of the "
    "trace, as under jax.jit by hand",
    "JIT": "its arguments only: a value read from outside them is a constant of the trace, "
    "as under jax.jit by hand",
    "EAGER": "everything: op by op",
}


def _name(item: Any, known: dict[str, str]) -> str | None:
    # nebulgym's NebulgymBackend enum members and plain strings both name a rung; an enum
    # member names one by its value or, when the value is no rung name, by its name.
    for value in (item, getattr(item, "value", None), getattr(item, "name", None)):
        if isinstance(value, str) and value.strip().upper() in known:
            return value.strip().upper()
    return None


def parse_backends(backends: Iterable[Any] | str | None, framework: str) -> tuple[str, ...]:
    """The rungs named by `backends`, in order, without repeats, ending with the eager rung.

    Args:
        backends: rung names (strings, case-insensitive, or enum members whose name or value
            is one), a single name, or None for `DEFAULTS`.
        framework: a framework with an adapter (`backends.FRAMEWORKS`).

    Raises:
        ArgumentError: an unknown name (the message lists the known ones), or an empty list.
    """
    known = RUNGS[framework]
    if backends is None:
        return DEFAULTS[framework]
    items = [backends] if isinstance(backends, str) else backends
    try:
        items = list(items)
    except TypeError:
        raise bad_argument(
            "backends", backends, f"None, a rung name or a sequence of them ({', '.join(known)})"
        ) from None
    names: list[str] = []
    for item in items:
        name = _name(item, known)
        if name not in known:
            raise bad_argument("backends", backends, f"names among {', '.join(known)}")
        if name not in names:
            names.append(name)
    if not names:
        raise bad_argument("backends", backends, "at least one rung name (or None)")
    eager = EAGER[framework]
    if names[-1] != eager:
        # Anything after the eager rung would never win a tie; eager closes the ladder.
        names = [n for n in names if n != eager] + [eager]
    return tuple(names)
