"""What one whole job is, for bench_jobs: the commands of each way of running it.

A job is timed as a user pays for it: each sample runs one whole command in a fresh process
(imports, data making, tuning, compiling, training, the last result), alternating the ways
sample by sample. Every job script prints, as its last stdout line, one JSON object with at
least ``"result"`` (a float or a list of floats: final losses, a checksum) so bench_jobs can
check that the ways computed the same thing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable


@dataclasses.dataclass(frozen=True)
class Job:
    """One job: its name, framework, and the command of each way (plain first).

    Attributes:
        name: the table's row name, e.g. ``"sweep/tiny-mlp/150"``.
        framework: ``"torch"`` or ``"jax"``.
        ways: way name -> argv; the first is the baseline (``"plain"``), then ``"ours"`` and
            any more (``"hand"``: batched by hand). Each argv runs one whole job.
        pairs: samples of each way (alternating); bench_jobs may lower it under ``--quick``.
        quick: in the ``--quick`` subset.
        env: extra environment variables for every way (thread pins are set by bench_jobs).
        devices: where the job can run: "cpu", and "cuda" for a job whose script takes
            ``--device cuda`` (its torch ways on the GPU; its JAX ways under
            ``JAX_PLATFORMS=cuda``).
        tolerance: relative difference allowed between the ways' results (None: not compared,
            e.g. when the ways draw different data orders).
        note: one line for the table (what the job shows).
    """

    name: str
    framework: str
    ways: dict[str, list[str]]
    pairs: int = 10
    quick: bool = False
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    devices: tuple[str, ...] = ("cpu",)
    tolerance: float | None = None
    note: str = ""


def script(name: str, *args: str) -> list[str]:
    """The argv running ``benchmarks/jobs/<name>.py`` with `args` under this Python."""
    return [PYTHON, str(HERE / f"{name}.py"), *args]


# ---- helpers for bench_jobs and the job scripts (added with bench_jobs) ---------------------


def pinned_env(threads: int, device: str = "cpu") -> dict[str, str]:
    """The thread pins bench_jobs sets in every sample's environment, for `threads` threads.

    And JAX's platform: the CPU, or the GPU for ``device="cuda"``.
    """
    n = str(threads)
    eigen = "true" if threads > 1 else "false"
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={eigen} intra_op_parallelism_threads={n}",
        "JAX_PLATFORMS": device,
    }


def last_json(stdout: str) -> dict[str, Any] | None:
    """The last stdout line that is a JSON object holding ``"result"``, or None."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "result" in value:
            return value
    return None


def values(result: object) -> list[float]:
    """A job's result as a flat list of floats (a number, or a list of numbers)."""
    if isinstance(result, (list, tuple)):
        return [float(v) for v in result]
    return [float(result)]  # type: ignore[arg-type]


def relative_difference(got: object, want: object) -> float:
    """How far `got` is from `want`: the largest ``|g - w| / scale`` over the elements.

    The scale is ``|w|``, floored at 1/1000 of the largest ``|w|`` of the result (so a
    sweep's member that trained to a loss of 1e-6 is judged against the sweep's losses, not
    against its own rounding noise); for a single number it is plainly relative. Results of
    different lengths, or a NaN, are infinitely far apart.
    """
    g, w = values(got), values(want)
    if len(g) != len(w) or not g:
        return math.inf
    floor = max(1e-3 * max(abs(v) for v in w), 1e-12)
    worst = 0.0
    for a, b in zip(g, w, strict=True):
        diff = abs(a - b) / max(abs(b), floor)
        if math.isnan(diff):
            return math.inf
        worst = max(worst, diff)
    return worst
