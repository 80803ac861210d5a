"""The isolation probe's verdict: did changing one member move another?

The adapters run the members (a two-member slice) once as they are and once with member
i's inputs and parameters perturbed, and hand the outputs, gradients and updated state here
as NumPy arrays with a leading member dimension. Any member other than i that moved beyond
the dtype's rounding is a leak.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dualtrain.errors import IsolationError

__all__ = ["failed_probe", "isolation_error", "leaks", "run_probe", "tolerance"]

_TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}


def tolerance(dtype: str) -> float:
    """Relative change below which a member is taken as unmoved (rounding, not a leak)."""
    return _TOLERANCE.get(str(dtype), 1e-5)


def leaks(
    base: Mapping[str, np.ndarray], changed: Mapping[str, np.ndarray], member: int
) -> list[str]:
    """What moved, for members other than `member`, between `base` and `changed`.

    Args:
        base: name -> array ``[members, ...]`` from the run as it is.
        changed: the same names from the run with `member` perturbed.
        member: the member perturbed.

    Returns:
        One phrase per leak (``"outputs of member 1 (by 0.25)"``); empty when isolated.
    """
    found = []
    for name, before in base.items():
        before = np.asarray(before)
        after = np.asarray(changed[name])
        for j in range(before.shape[0]):
            if j == member:
                continue
            b = before[j].astype(np.float64, copy=False)
            a = after[j].astype(np.float64, copy=False)
            if b.size == 0:
                continue
            same_nan = np.array_equal(np.isnan(a), np.isnan(b))
            diff = float(np.nanmax(np.abs(a - b))) if not np.all(np.isnan(a - b)) else 0.0
            scale = max(1.0, float(np.nanmax(np.abs(b))) if not np.all(np.isnan(b)) else 1.0)
            if not same_nan or diff > tolerance(before.dtype.name) * scale:
                found.append(f"{name} of member {j} (by {diff:.3g})")
    return found


def isolation_error(
    strategy: str, member: int, found: Sequence[str], culprit: str | None
) -> IsolationError:
    """The error a leak raises: the strategy, what moved, and the module that mixed them."""
    where = (
        f"{culprit} mixes members"
        if culprit
        else "the op that mixes members could not be narrowed to one module"
    )
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    return IsolationError(
        f"members are not isolated under strategy {strategy!r}: perturbing member {member}'s "
        f"inputs and parameters changed {shown}; {where}. Typical causes: state kept outside "
        "the parameters and buffers (a plain tensor attribute updated in forward), a global, "
        "or a custom op over the member dimension. Keep per-member state in registered "
        "buffers, or pass check_isolation=False if the coupling is intended."
    )


def failed_probe(strategy: str, error: BaseException) -> IsolationError:
    """The error when a strategy ran every member but then failed on the probe's slice.

    A module whose second call fails on two members after a first call on all of them
    carries state from call to call that depends on the members (a tensor attribute that
    took the member count, say): the members are not independent.
    """
    return IsolationError(
        f"members are not isolated under strategy {strategy!r}: it ran every member, then "
        f"failed on the isolation probe's two-member slice ({type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else ''}); the module keeps state from "
        "call to call that depends on the members (a plain tensor attribute updated in "
        "forward, say). Keep per-member state in registered buffers, or pass "
        "check_isolation=False if the coupling is intended."
    )


def run_probe(probe: Callable[[], str], strategy: str, ran: bool) -> str:
    """Runs an adapter's probe; returns its verdict for `explain`.

    Args:
        probe: runs the probe and returns its verdict, or raises `IsolationError`.
        strategy: the strategy probed.
        ran: whether the strategy already ran every member (measured just before): then
            any failure on the probe's slice is itself a sign of coupling (`failed_probe`);
            otherwise the module's own error is raised as it is.
    """
    try:
        return probe()
    except IsolationError:
        raise
    except Exception as error:
        if not ran:
            raise
        raise failed_probe(strategy, error) from error
