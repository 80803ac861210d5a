"""The whole-job scripts of bench_jobs (multiverse, tank, store) at tiny sizes: each way runs
from its job's own argv and the ways' results agree within the job's tolerance. No timing.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from jobs import multiverse, store, tank  # noqa: E402
from jobs.common import Job, last_json, pinned_env, relative_difference, values  # noqa: E402

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    """bench_jobs' environment: its pins (1 thread), not the 4 host devices conftest asks for."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "XLA_FLAGS")}
    return {**env, **pinned_env(1)}


@functools.cache
def _run(argv: tuple[str, ...]) -> Any:
    """The result of one whole job (the same argv runs once: both stores share the plain way)."""
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    out = last_json(done.stdout)
    assert out is not None, f"{argv}: no JSON result line\n{done.stdout[-2000:]}"
    return out["result"]


def _check(job: Job, *shrink: str) -> None:
    """Runs every way of `job` with `shrink` appended, two at a time; results agree."""
    assert next(iter(job.ways)) == "plain" and "ours" in job.ways
    with ThreadPoolExecutor(2) as pool:
        argvs = [(*argv, *shrink) for argv in job.ways.values()]
        results = dict(zip(job.ways, pool.map(_run, argvs), strict=True))
    assert job.tolerance is not None
    for way, got in results.items():
        assert all(math.isfinite(v) for v in values(got)), (job.name, way, got)
        difference = relative_difference(got, results["plain"])
        assert difference <= job.tolerance, (job.name, way, got, results["plain"])


def _job(jobs: list[Job], name: str, framework: str) -> Job:
    return next(j for j in jobs if j.name == name and j.framework == framework)


def test_jobs_are_declared() -> None:
    for module in (multiverse, tank, store):
        for job in module.JOBS:
            assert list(job.ways)[:2] == ["plain", "ours"] and not job.quick
            assert job.framework in ("torch", "jax") and job.pairs >= 1 and job.note
        assert len({(j.name, j.framework) for j in module.JOBS}) == len(module.JOBS)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_multiverse_ways_agree(framework: str) -> None:
    # The launchers: torch, torchrun's DDP against Multiverse's spawned workers; JAX, two
    # processes joined by jax.distributed by hand against Multiverse's two.
    _check(_job(multiverse.JOBS, "multiverse/mlp/2w", framework), "--steps", "8")


@pytest.mark.parametrize(
    ("framework", "kind", "workers"),
    # DataLoader over h5py, NumPy indexing, the Tank on a tabular pack; Pillow in a pool of
    # 2 processes against generate + the Tank's 2 threads serving JAX.
    [("torch", "tabular", 0), ("jax", "images", 2)],
)
def test_tank_ways_agree(framework: str, kind: str, workers: int) -> None:
    job = _job(tank.JOBS, f"tank/{kind}/{workers}w", framework)
    _check(job, "--rows", "150", "--size", "32")


def test_store_ways_agree() -> None:
    shrink = ("--rows", "5000", "--ids", "256", "--steps", "5")
    for framework in ("torch", "jax"):
        _check(_job(store.JOBS, "store/1M-x-128/8192-ids", framework), *shrink)
