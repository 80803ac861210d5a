"""Whole training jobs, timed as a user pays for them, each beside the plain way, in one run.

Each sample runs one whole job in a fresh process (``subprocess.run``), timed by the wall
clock from its start to its exit: imports, data making, tuning, compiling, every optimizer
step and the last result all count. The jobs come from the registry (``benchmarks/jobs``:
each job module's ``JOBS``; see ``jobs/common.py`` for the `Job` contract). The ways of a job
alternate sample by sample (plain, ours, hand, plain, ours, hand, ...), so a noisy shared
machine slows them alike; each row reports every way's median, and the median over the
pairs of the ratio plain/ours (> 1: ours is faster) with its 10th-90th percentile spread.

Caches:

- ``cold``: every sample gets fresh, empty ``DUALTRAIN_CACHE_DIR``,
  ``TORCHINDUCTOR_CACHE_DIR`` and ``XDG_CACHE_HOME`` folders (removed after it): the first
  run of a job on a new machine.
- ``warm``: one untimed priming run per way fills that way's folders, and its samples reuse
  them: every later run.

The project's bytecode is compiled once before the first sample, as installing it compiles
it (a checkout run with PYTHONDONTWRITEBYTECODE would compile dualtrain's sources in every
job process, 0.1-0.4 s, where torch's and JAX's come compiled).

Every sample runs with the thread pins (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
``OPENBLAS_NUM_THREADS`` = ``--threads``, ``XLA_FLAGS`` with XLA's intra-op threads, and
``JAX_PLATFORMS=cpu``, or ``cuda`` under ``--device cuda``), then the job's own ``env``.
Each job prints a last JSON line with its ``"result"``; the ways must agree within the job's
tolerance (`jobs.common.relative_difference` against the first plain sample), or the row is
marked.

    .venv/bin/python benchmarks/bench_jobs.py [--quick] [--only SUBSTRING] [--pairs N]
        [--cache cold|warm|both] [--threads N] [--device cpu|cuda] [--json PATH] [--list]

On a lent GPU, ``--quick --device cuda`` runs the 150-step sweeps there: the torch ways
train on ``cuda`` and the JAX ways run under ``JAX_PLATFORMS=cuda``.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness
import jobs
from jobs.common import Job, last_json, pinned_env, relative_difference

ROOT = Path(__file__).resolve().parent.parent
CACHE_VARS = ("DUALTRAIN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME")
# a launcher's variables that would make a job script think it is one rank of a larger run
DROPPED_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
# --quick: 2 pairs, cold only. One cold pair of the quick jobs (sweeps at 150 steps, the
# ladder) took 6.8 minutes on the 2 cores while other work ran (load 5-6): two pairs should
# take about 10 minutes on a quiet machine (an estimate).
QUICK_PAIRS = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="dualtrain benchmark: whole jobs")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"the jobs marked quick, {QUICK_PAIRS} pairs, cold caches only",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SUBSTRING",
        help="jobs whose 'name framework' holds it (repeatable: any)",
    )
    parser.add_argument(
        "--pairs", type=int, default=None, help="samples of each way (default: each job's own)"
    )
    parser.add_argument(
        "--cache",
        choices=("cold", "warm", "both"),
        default=None,
        help="default: both (cold under --quick)",
    )
    parser.add_argument("--threads", type=int, default=1, help="threads per job process")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the jobs that can run on a GPU (the sweeps), there",
    )
    parser.add_argument("--json", type=Path, default=harness.RESULTS / "bench_jobs.json")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per sample")
    parser.add_argument("--list", action="store_true", help="list the selected jobs and exit")
    args = parser.parse_args(argv)
    if args.threads <= 0:
        parser.error(f"--threads must be a positive int; got {args.threads}")
    if args.pairs is not None and args.pairs <= 0:
        parser.error(f"--pairs must be a positive int; got {args.pairs}")
    if args.cache is None:
        args.cache = "cold" if args.quick else "both"
    return args


def select(all_jobs: list[Job], args: argparse.Namespace) -> list[Job]:
    """The jobs asked for: quick ones under ``--quick``, that run on ``--device``, matching
    any ``--only``."""
    chosen = [j for j in all_jobs if (j.quick or not args.quick) and args.device in j.devices]
    if args.only:
        chosen = [j for j in chosen if any(s in f"{j.name} {j.framework}" for s in args.only)]
    return chosen


def pairs_of(job: Job, args: argparse.Namespace) -> int:
    if args.pairs is not None:
        return args.pairs
    return min(job.pairs, QUICK_PAIRS) if args.quick else job.pairs


# ---- running samples -----------------------------------------------------------------------


@dataclasses.dataclass
class Sample:
    """One whole run of one way: wall seconds, exit status, its summary line."""

    way: str
    pair: int
    seconds: float
    rc: int | str
    out: dict[str, Any] | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.out is not None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _cache_dirs() -> dict[str, str]:
    """Fresh, empty cache folders, one per variable, under one temporary root."""
    root = Path(tempfile.mkdtemp(prefix="dualtrain-bench-jobs-"))
    dirs = {var: str(root / var.lower()) for var in CACHE_VARS}
    for d in dirs.values():
        Path(d).mkdir()
    return dirs


def _remove(dirs: dict[str, str]) -> None:
    roots = {str(Path(d).parent) for d in dirs.values()}
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


def _env(job: Job, threads: int, dirs: dict[str, str], device: str = "cpu") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_VARS}
    env.update(pinned_env(threads, device))
    env.update(job.env)
    env.update(dirs)
    return env


def run_once(argv: list[str], env: dict[str, str], way: str, pair: int, timeout: float) -> Sample:
    """Runs `argv` to its exit; the wall clock covers the whole process."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return Sample(way, pair, time.perf_counter() - start, "timeout", None, f"> {timeout} s")
    seconds = time.perf_counter() - start
    out = last_json(done.stdout)
    error = ""
    if done.returncode != 0 or out is None:
        tail = (done.stderr or done.stdout)[-1500:]
        error = tail if done.returncode != 0 else f"no JSON result line\n{tail}"
    return Sample(way, pair, seconds, done.returncode, out, error)


def run_job(job: Job, cache: str, pairs: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every sample of one job under one cache mode; returns the row (with every sample)."""
    label = f"{job.name} [{job.framework}, {cache}]"
    warm = {way: _cache_dirs() for way in job.ways} if cache == "warm" else {}
    failed: set[str] = set()
    samples: list[Sample] = []
    extra = [] if args.device == "cpu" else ["--device", args.device]
    ways = {way: [*argv, *extra] for way, argv in job.ways.items()}
    try:
        for way, argv in ways.items() if cache == "warm" else ():
            env = _env(job, args.threads, warm[way], args.device)
            prime = run_once(argv, env, way, -1, args.timeout)
            _progress(label, "priming", prime)
            samples.append(prime)
            if not prime.ok:
                failed.add(way)
        for pair in range(pairs):
            for way, argv in ways.items():
                if way in failed:
                    continue
                dirs = warm[way] if cache == "warm" else _cache_dirs()
                try:
                    env = _env(job, args.threads, dirs, args.device)
                    sample = run_once(argv, env, way, pair, args.timeout)
                finally:
                    if cache == "cold":
                        _remove(dirs)
                _progress(label, f"pair {pair + 1}/{pairs}", sample)
                samples.append(sample)
                if not sample.ok:
                    failed.add(way)
    finally:
        for dirs in warm.values():
            _remove(dirs)
    return summarize(job, cache, pairs, samples)


def _progress(label: str, when: str, sample: Sample) -> None:
    status = "" if sample.ok else f"  FAILED ({sample.rc}): {sample.error.strip()[-300:]}"
    print(f"  {label} {when} {sample.way}: {sample.seconds:.2f} s{status}", flush=True)


# ---- summaries -----------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float] | None:
    """Median and 10th-90th percentiles (harness' rule), None for no values."""
    if not values:
        return None
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "median": statistics.median(ordered),
        "p10": pick(0.1),
        "p90": pick(0.9),
        "n": len(ordered),
    }


def check(job: Job, samples: list[Sample]) -> dict[str, Any]:
    """Do the ways agree? Every timed sample's result against the first plain one's."""
    timed = [s for s in samples if s.pair >= 0]
    failed = sorted({s.way for s in samples if not s.ok})
    if failed:
        return {"status": "failed", "failed": failed, "text": f"FAILED: {', '.join(failed)}"}
    if job.tolerance is None:
        return {"status": "not compared", "text": "not compared"}
    plain = next(iter(job.ways))
    reference = next((s for s in timed if s.way == plain), None)
    if reference is None or reference.out is None:
        return {"status": "failed", "failed": [plain], "text": f"FAILED: no {plain} sample"}
    worst: dict[str, float] = {}
    for s in timed:
        assert s.out is not None
        diff = relative_difference(s.out["result"], reference.out["result"])
        worst[s.way] = max(worst.get(s.way, 0.0), diff)
    bad = {w: d for w, d in worst.items() if not d <= job.tolerance}
    largest = max(worst.values(), default=0.0)
    if bad:
        text = "DIFFER: " + ", ".join(f"{w} {d:.2g}" for w, d in bad.items())
        text += f" > {job.tolerance:g}"
        return {"status": "differ", "worst": worst, "tolerance": job.tolerance, "text": text}
    text = f"ok ({largest:.1g} <= {job.tolerance:g})"
    return {"status": "ok", "worst": worst, "tolerance": job.tolerance, "text": text}


def summarize(job: Job, cache: str, pairs: int, samples: list[Sample]) -> dict[str, Any]:
    ways = list(job.ways)
    timed = [s for s in samples if s.pair >= 0 and s.ok]
    seconds = {w: [s.seconds for s in timed if s.way == w] for w in ways}
    by_pair = {(s.way, s.pair): s.seconds for s in timed}
    ratios: dict[str, Any] = {}
    base = ways[0]
    for way in ways:
        if way == "ours":
            continue
        paired = [
            by_pair[way, k] / by_pair["ours", k]
            for k in range(pairs)
            if (way, k) in by_pair and ("ours", k) in by_pair
        ]
        ratios[f"{way}/ours"] = spread(paired)
    # Seconds after the framework's import, where a job reports them ("work_s"): the part
    # of the job its way's choices change.
    work = {
        (s.way, s.pair): float(s.out["work_s"])
        for s in timed
        if s.out is not None and isinstance(s.out.get("work_s"), int | float)
    }
    work_ratios = {
        f"{way}/ours": spread(
            [
                work[way, k] / work["ours", k]
                for k in range(pairs)
                if (way, k) in work and ("ours", k) in work
            ]
        )
        for way in ways
        if way != "ours"
    }
    details = {
        w: next((s.out.get("detail") for s in reversed(timed) if s.way == w and s.out), None)
        for w in ways
    }
    return {
        "job": job.name,
        "framework": job.framework,
        "cache": cache,
        "note": job.note,
        "pairs": pairs,
        "baseline": base,
        "ways": {w: spread(seconds[w]) for w in ways},
        "ratios": ratios,
        "work_ratios": work_ratios,
        "check": check(job, samples),
        "details": details,
        "argv": job.ways,
        "env": job.env,
        "samples": [s.as_dict() for s in samples],
    }


def _secs(t: dict[str, float] | None) -> str:
    return "-" if t is None else f"{t['median']:.2f}"


def _ratio(t: dict[str, float] | None) -> str:
    if t is None:
        return "-"
    return f"{t['median']:.2f}x [{t['p10']:.2f}-{t['p90']:.2f}]"


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    title = (
        f"bench_jobs: whole jobs, one fresh process per sample, {args.threads} thread(s); "
        "median seconds; ratio = median over pairs [p10-p90], > 1: ours is faster"
    )
    out = Table(title=escape(title))
    columns = (
        "job",
        "framework",
        "cache",
        "plain s",
        "ours s",
        "hand s",
        "plain/ours [p10-p90]",
        "hand/ours",
        "after import: plain/ours, hand/ours",
        "results",
    )
    for c in columns:
        out.add_column(
            c, justify="left" if c in ("job", "framework", "cache", "results") else "right"
        )
    for row in rows:
        ways = list(row["ways"])
        base, others = ways[0], [w for w in ways[1:] if w != "ours"]
        extra_s = ", ".join(
            (_secs(row["ways"][w]) if w == "hand" else f"{w}: {_secs(row['ways'][w])}")
            for w in others
        )
        extra_r = ", ".join(
            (
                _ratio(row["ratios"][f"{w}/ours"])
                if w == "hand"
                else f"{w}: {_ratio(row['ratios'][f'{w}/ours'])}"
            )
            for w in others
        )
        plain_s = (
            _secs(row["ways"][base]) if base == "plain" else f"{base}: {_secs(row['ways'][base])}"
        )
        cells = (
            row["job"],
            row["framework"],
            row["cache"],
            plain_s,
            _secs(row["ways"].get("ours")),
            extra_s or "-",
            _ratio(row["ratios"].get(f"{base}/ours")),
            extra_r or "-",
            ", ".join(_ratio(r) for r in row.get("work_ratios", {}).values() if r) or "-",
            row["check"]["text"],
        )
        out.add_row(*(escape(c) for c in cells))
    Console(width=220).print(out)
    notes = {(r["job"], r["framework"]): r["note"] for r in rows if r["note"]}
    for (name, framework), note in notes.items():
        print(f"  {name} [{framework}]: {note}")
    for r in rows:  # what each way said of itself (a strategy, a rung, a cache hit)
        said = "; ".join(f"{w}: {d}" for w, d in r["details"].items() if d and w != "plain")
        if said:
            print(f"  {r['job']} [{r['framework']}, {r['cache']}] {said}")


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


PACKAGES = ("dualtrain", "dualtrain_torch", "dualtrain_jax")


def compile_packages() -> None:
    """Compiles the project's bytecode once, as installing it does (pip compiles a wheel).

    Run from a checkout with PYTHONDONTWRITEBYTECODE set (this machine's default), every
    job process would otherwise compile dualtrain's sources again (0.1-0.4 s a process),
    where torch's and JAX's come compiled: both ways start from compiled packages.
    """
    for name in PACKAGES:
        compileall.compile_dir(str(ROOT / name), quiet=1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    chosen = select(jobs.collect(), args)
    caches = ("cold", "warm") if args.cache == "both" else (args.cache,)
    if args.list or not chosen:
        for job in chosen:
            print(
                f"{job.name} [{job.framework}]: {', '.join(job.ways)}; {pairs_of(job, args)} "
                f"pairs; {job.note}"
            )
        if not chosen:
            print("bench_jobs: no job matches")
        return
    print(
        f"bench_jobs: {len(chosen)} job(s) x {len(caches)} cache mode(s), "
        f"{args.threads} thread(s) per process",
        flush=True,
    )
    started = time.time()
    load_before = os.getloadavg()
    compile_packages()
    rows = [run_job(job, cache, pairs_of(job, args), args) for job in chosen for cache in caches]
    table(rows, args)
    payload = {
        "benchmark": "jobs",
        "threads": args.threads,
        "machine": {
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "bytecode": "the project's compiled before the run, as an install compiles it",
        },
        "commit": _git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "wall_s": time.time() - started,
        "options": {
            "quick": args.quick,
            "only": args.only,
            "pairs": args.pairs,
            "cache": args.cache,
            "timeout": args.timeout,
            "device": args.device,
        },
        "pins": pinned_env(args.threads, args.device),
        "rows": rows,
    }
    harness._write_atomic(args.json, json.dumps(payload, indent=2, default=str))
    print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
