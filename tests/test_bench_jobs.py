"""bench_jobs and its sweep and ladder jobs, at tiny sizes: the registry, every Job's ways,
the ways' results agreeing, and the sampling machinery (cache folders, checks). No timing.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_jobs  # noqa: E402
import jobs  # noqa: E402
from jobs import ladder, sweeps  # noqa: E402
from jobs.common import Job, last_json, relative_difference  # noqa: E402


def test_registry_collects_every_job_with_its_ways() -> None:
    found = jobs.collect()
    assert found, "no jobs"
    names = {(j.name, j.framework) for j in found}
    assert len(names) == len(found), "two jobs share a name and framework"
    for job in found:
        assert isinstance(job, Job)
        assert job.framework in ("torch", "jax"), job
        ways = list(job.ways)
        assert ways[0] == "plain" and "ours" in ways, (job.name, ways)
        for argv in job.ways.values():
            assert argv and all(isinstance(a, str) for a in argv), argv
            scripts = [a for a in argv if a.endswith(".py")]
            assert scripts and all(Path(s).is_file() for s in scripts), argv
        assert job.pairs >= 1
        assert job.tolerance is None or job.tolerance > 0
    assert {(j.name, j.framework) for j in sweeps.JOBS + ladder.JOBS} <= names
    quick = [j for j in found if j.quick]
    assert {j.name for j in quick} >= {"sweep/cnn/150", "ladder/cnn/3x30"}


def test_registry_skips_a_missing_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert jobs.collect(("sweeps", "no_such_jobs")) == sweeps.JOBS
    assert "no_such_jobs.py" in capsys.readouterr().out


def _sweep(framework: str, way: str, capsys: pytest.CaptureFixture[str]) -> list[float]:
    argv = ["--framework", framework, "--way", way, "--model", "tiny-mlp", "--steps", "3"]
    sweeps.main([*argv, "--members", "4"])
    out = last_json(capsys.readouterr().out)
    assert out is not None and out["way"] == way
    return [float(v) for v in out["result"]]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_sweep_ways_agree(framework: str, capsys: pytest.CaptureFixture[str]) -> None:
    results = {way: _sweep(framework, way, capsys) for way in sweeps.WAYS}
    plain = results["plain"]
    assert len(plain) == 4 and all(math.isfinite(v) for v in plain)
    assert len(set(plain)) == 4, "the members' learning rates made no difference"
    for way, got in results.items():
        assert relative_difference(got, plain) <= 1e-4, (way, got, plain)


def test_sweep_cnn_hand_matches_plain(capsys: pytest.CaptureFixture[str]) -> None:
    results = []
    for way in ("plain", "hand"):
        argv = ["--framework", "torch", "--way", way, "--model", "cnn", "--steps", "2"]
        sweeps.main([*argv, "--members", "2"])
        out = last_json(capsys.readouterr().out)
        assert out is not None
        results.append(out["result"])
    assert relative_difference(results[1], results[0]) <= 1e-4


@pytest.mark.slow
def test_ladder_plain_ways_run(capsys: pytest.CaptureFixture[str]) -> None:
    for framework in ("torch", "jax"):
        ladder.main(["--framework", framework, "--way", "plain", "--steps", "1"])
        out = last_json(capsys.readouterr().out)
        assert out is not None and math.isfinite(out["result"]), out


def test_relative_difference_and_last_json() -> None:
    assert relative_difference([1.0, 2.0], [1.0, 2.0]) == 0
    assert relative_difference(1.1, 1.0) == pytest.approx(0.1)
    assert relative_difference([1.0], [1.0, 2.0]) == math.inf
    assert relative_difference([math.nan], [1.0]) == math.inf
    # a tiny element is judged against 1/1000 of the largest, not its own size
    assert relative_difference([1.0, 2e-6], [1.0, 1e-6]) == pytest.approx(1e-6 / 1e-3)
    text = 'noise\n{"result": [1, 2], "way": "plain"}\nnot json {\n'
    assert last_json(text) == {"result": [1, 2], "way": "plain"}
    assert last_json('{"no": 1}') is None


_PRINT_CACHE = (
    "import json, os, sys; d = os.environ['DUALTRAIN_CACHE_DIR']; "
    "open(os.path.join(d, 'x'), 'a').write('x'); "
    "print(json.dumps({'result': float(sys.argv[1]), 'detail': [d, os.listdir(d), "
    "os.environ['OMP_NUM_THREADS'], os.environ.get('JOB_ENV')]}))"
)


def _fake_job(results: dict[str, str], tolerance: float | None = 1e-3) -> Job:
    ways = {w: [sys.executable, "-c", _PRINT_CACHE, r] for w, r in results.items()}
    return Job("fake", "torch", ways, pairs=2, env={"JOB_ENV": "1"}, tolerance=tolerance)


def _args() -> Any:
    return bench_jobs.parse_args(["--threads", "2"])


def test_cold_samples_get_fresh_folders_warm_ones_reuse_theirs() -> None:
    job = _fake_job({"plain": "1.0", "ours": "1.0", "hand": "1.0"})
    cold = bench_jobs.run_job(job, "cold", 2, _args())
    details = [s["out"]["detail"] for s in cold["samples"]]
    assert len(details) == 6 and all(s["pair"] >= 0 for s in cold["samples"])
    assert len({d[0] for d in details}) == 6, "a cold sample reused a folder"
    assert all(d[1] == ["x"] and d[2] == "2" and d[3] == "1" for d in details)
    warm = bench_jobs.run_job(job, "warm", 2, _args())
    samples = warm["samples"]
    assert [s["pair"] for s in samples][:3] == [-1, -1, -1], "no priming run"
    by_way: dict[str, set[str]] = {}
    for s in samples:
        by_way.setdefault(s["way"], set()).add(s["out"]["detail"][0])
    assert all(len(folders) == 1 for folders in by_way.values()), by_way
    assert len(set.union(*by_way.values())) == 3, "two ways shared a folder"
    timed = [s for s in samples if s["pair"] >= 0]
    assert all(s["out"]["detail"][1] == ["x"] for s in timed), "a warm folder was emptied"
    folders = [d[0] for d in details] + list(set.union(*by_way.values()))
    assert not any(os.path.exists(f) for f in folders), "a cache folder was left behind"
    for row in (cold, warm):
        assert row["check"]["status"] == "ok"
        assert row["ratios"]["plain/ours"]["n"] == 2
        assert set(row["ratios"]) == {"plain/ours", "hand/ours"}
        json.dumps(row, default=str)


def test_rows_are_marked_when_ways_differ_or_fail() -> None:
    differ = bench_jobs.run_job(_fake_job({"plain": "1.0", "ours": "1.5"}), "cold", 1, _args())
    assert differ["check"]["status"] == "differ" and "ours" in differ["check"]["text"]
    loose = _fake_job({"plain": "1.0", "ours": "1.5"}, tolerance=None)
    assert bench_jobs.run_job(loose, "cold", 1, _args())["check"]["status"] == "not compared"
    broken = _fake_job({"plain": "1.0", "ours": "oops"})
    row = bench_jobs.run_job(broken, "cold", 2, _args())
    assert row["check"]["status"] == "failed" and row["check"]["failed"] == ["ours"]
    assert [s["way"] for s in row["samples"]] == ["plain", "ours", "plain"], "a failed way reran"
    assert row["ratios"]["plain/ours"] is None


def test_selection_and_pairs() -> None:
    all_jobs = jobs.collect(("sweeps", "ladder"))
    quick = bench_jobs.select(all_jobs, bench_jobs.parse_args(["--quick"]))
    assert quick and all(j.quick for j in quick)
    only = bench_jobs.select(all_jobs, bench_jobs.parse_args(["--only", "ladder"]))
    assert {j.name for j in only} == {"ladder/cnn/3x30"}
    args = bench_jobs.parse_args(["--quick"])
    assert args.cache == "cold" and bench_jobs.pairs_of(all_jobs[0], args) == bench_jobs.QUICK_PAIRS
    assert bench_jobs.pairs_of(all_jobs[0], bench_jobs.parse_args(["--pairs", "7"])) == 7
    assert bench_jobs.parse_args([]).cache == "both"


def test_device_cuda_selects_the_gpu_jobs_and_tells_their_ways() -> None:
    """``--device cuda``: only jobs that can run on a GPU, each way told ``--device cuda``
    and JAX's platform set to cuda (what a lent GPU's bench_jobs run relies on)."""
    all_jobs = jobs.collect(("sweeps", "ladder"))
    args = bench_jobs.parse_args(["--quick", "--device", "cuda"])
    chosen = bench_jobs.select(all_jobs, args)
    assert chosen and all("cuda" in j.devices and j.name.startswith("sweep/") for j in chosen)
    assert {j.framework for j in chosen} == {"torch", "jax"}
    assert bench_jobs.pinned_env(1, "cuda")["JAX_PLATFORMS"] == "cuda"
    assert bench_jobs.pinned_env(1)["JAX_PLATFORMS"] == "cpu"
    # The fake ways print their arguments: what run_job appended to the job's own.
    ways = {w: [sys.executable, "-c", _PRINT_ARGV] for w in ("plain", "ours")}
    row = bench_jobs.run_job(Job("argv", "torch", ways, pairs=1), "cold", 1, args)
    assert [s["out"]["detail"] for s in row["samples"]] == [["--device", "cuda"]] * 2
    cpu = bench_jobs.run_job(Job("argv", "torch", ways, pairs=1), "cold", 1, _args())
    assert [s["out"]["detail"] for s in cpu["samples"]] == [[]] * 2


_PRINT_ARGV = "import json, sys; print(json.dumps({'result': 1.0, 'detail': sys.argv[1:]}))"
