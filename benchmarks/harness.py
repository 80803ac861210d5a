"""Shared benchmark machinery: threads, timing, the comparison table, JSON results.

Every benchmark runs its baseline in the same process and reports ours beside it:

    args = harness.parse_args("interop")      # --threads, --quick, --json, set before imports
    import torch                               # frameworks only after parse_args
    row = harness.compare("case", baseline=lambda: ..., ours=lambda: ...)
    harness.report("interop", [row, ...], args)

Timings alternate baseline and ours sample by sample, so a noisy shared machine slows both
alike; each sample runs enough calls to last `sample_s`, and the median and the 10th-90th
percentile spread are reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def parse_args(name: str, argv: list[str] | None = None) -> argparse.Namespace:
    """Reads the common options and pins thread counts; call before importing frameworks."""
    parser = argparse.ArgumentParser(description=f"dualtrain benchmark: {name}")
    parser.add_argument("--threads", type=int, default=1, help="threads per framework")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter samples")
    parser.add_argument("--json", type=Path, default=RESULTS / f"{name}.json")
    args = parser.parse_args(argv)
    if args.threads <= 0:
        parser.error(f"--threads must be a positive int; got {args.threads}")
    _pin_threads(args.threads)
    return args


def _pin_threads(n: int) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_cpu_multi_thread_eigen={'true' if n > 1 else 'false'} "
        f"intra_op_parallelism_threads={n}"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def set_torch_threads(n: int) -> None:
    """torch reads its thread count at import; call right after ``import torch``."""
    import torch

    torch.set_num_threads(n)


@dataclasses.dataclass
class Timing:
    """Seconds per call: the median and the 10th-90th percentile spread of the samples."""

    median: float
    p10: float
    p90: float
    samples: int

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Row:
    """One comparison: a case, the baseline's and our timing, and extras to print."""

    case: str
    baseline: str
    base: Timing
    ours: Timing
    extra: dict[str, Any]

    @property
    def ratio(self) -> float:
        """Our speed relative to the baseline (> 1: faster)."""
        return self.base.median / self.ours.median


def _calls_per_sample(fn: Callable[[], Any], sample_s: float) -> int:
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(100_000, int(sample_s / once)))


def _sample(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _summary(values: list[float]) -> Timing:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return Timing(statistics.median(ordered), pick(0.1), pick(0.9), len(ordered))


def compare(
    case: str,
    *,
    baseline: Callable[[], Any],
    ours: Callable[[], Any],
    baseline_name: str,
    quick: bool = False,
    warmup: int = 3,
    **extra: Any,
) -> Row:
    """Times `baseline` and `ours` alternately after `warmup` calls each."""
    for _ in range(warmup):
        baseline()
        ours()
    sample_s, samples = (0.02, 5) if quick else (0.05, 11)
    calls_b = _calls_per_sample(baseline, sample_s)
    calls_o = _calls_per_sample(ours, sample_s)
    base, mine = [], []
    for _ in range(samples):
        base.append(_sample(baseline, calls_b))
        mine.append(_sample(ours, calls_o))
    return Row(case, baseline_name, _summary(base), _summary(mine), extra)


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def report(name: str, rows: list[Row], args: argparse.Namespace, **meta: Any) -> None:
    """Prints the table (baseline beside ours, ratio, extras) and writes the JSON."""
    from rich.console import Console
    from rich.table import Table

    extras = sorted({k for row in rows for k in row.extra})
    table = Table(title=f"{name}: {args.threads} thread(s), median of samples [p10-p90]")
    for column in ("case", "baseline", "baseline time", "dualtrain time", "ratio", *extras):
        table.add_column(column, justify="left" if column in ("case", "baseline") else "right")
    for row in rows:
        table.add_row(
            row.case,
            row.baseline,
            f"{_fmt(row.base.median)} [{_fmt(row.base.p10)}-{_fmt(row.base.p90)}]",
            f"{_fmt(row.ours.median)} [{_fmt(row.ours.p10)}-{_fmt(row.ours.p90)}]",
            f"{row.ratio:.2f}x",
            *(str(row.extra.get(k, "")) for k in extras),
        )
    Console(width=200).print(table)
    payload = {
        "benchmark": name,
        "threads": args.threads,
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count()},
        "meta": meta,
        "rows": [
            {
                "case": r.case,
                "baseline": r.baseline,
                "baseline_s": r.base.as_dict(),
                "ours_s": r.ours.as_dict(),
                "ratio": r.ratio,
                **r.extra,
            }
            for r in rows
        ],
    }
    _write_atomic(args.json, json.dumps(payload, indent=2, default=str))
    print(f"results written to {args.json}")


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
