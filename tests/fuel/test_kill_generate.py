"""SIGKILL `FuelGenerator.generate` at random moments: the previous pack still loads, no
partial file sits under a final name, and the next generate removes the dead writer's
temporary files."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dualtrain import PackError
from dualtrain.atomic import is_temp, writer_of
from dualtrain.fuel import FuelGenerator, Tank, shard_paths
from tests.fuel.raw import make_folder, stored_meta

N = 80
DTYPES = ["int64", "float32", "vint32", "str"]

_CHILD = """
import sys
from dualtrain.fuel import FuelGenerator
folder, dst, shards = sys.argv[1], sys.argv[2], int(sys.argv[3])
gen = FuelGenerator(file_dir=folder, file_list=folder + "/list.csv",
                    dtype=["int64", "float32", "vint32", "str"])
print("go", flush=True)
gen.generate(dst, 48, 48, encode="PNG", shards=shards, workers=0)
"""


def _child(folder: str, dst: str, shards: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, folder, dst, str(shards)],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "go"
    return proc


def _writing(proc: subprocess.Popen, out: str, timeout: float = 300.0) -> bool:
    """Polls until `proc` has a temporary file in `out` (True), or has ended (False: the
    poll, descheduled on a busy machine, missed a write lasting a fraction of a second)."""
    deadline = time.monotonic() + timeout
    while not any((w := writer_of(n)) is not None and w[1] == proc.pid for n in os.listdir(out)):
        if proc.poll() is not None:
            assert proc.returncode == 0, f"the writer failed: code {proc.returncode}"
            return False
        assert time.monotonic() < deadline, f"no temporary file after {timeout} s"
        time.sleep(0.001)
    return True


def _child_writing(folder: str, dst: str, shards: int, out: str) -> subprocess.Popen:
    """A child caught writing (one whose whole write the poll missed is run again)."""
    for _ in range(10):
        proc = _child(folder, dst, shards)
        if _writing(proc, out):
            return proc
        proc.communicate()  # a whole pack of its own: a state the checks accept too
    raise AssertionError("10 writers ended before their temporary file was seen")


def _check_folder(out: str, dst: str, shards: int) -> None:
    """Final names hold whole packs of one run, or a mix the reader refuses."""
    names = os.listdir(out)
    finals = [n for n in names if not is_temp(n)]
    assert set(finals) <= {os.path.basename(p) for p in shard_paths(dst, shards)}, names
    paths = [os.path.join(out, n) for n in sorted(finals)]
    metas = [stored_meta(p) for p in paths]  # a partial file would fail to read here
    assert all(m["shards"] == shards for m in metas)
    runs = {m["run"] for m in metas}
    if len(runs) == 1:
        tank = Tank(paths, {"label": "int64"}, N, shuffle=False)
        np.testing.assert_array_equal(np.sort(tank.next()["label"]), np.sort(np.arange(N) % 5))
    else:  # killed between two renames: the reader tells the runs apart
        with pytest.raises(PackError, match="different generate runs"):
            Tank(paths, {"label": "int64"}, N)


@pytest.mark.slow
def test_a_killed_generate_never_breaks_the_pack(tmp_path):
    folder = str(tmp_path / "raw")
    make_folder(folder, N, size=(64, 64))
    out = tmp_path / "out"
    out.mkdir()
    rng = random.Random(0)
    gen = FuelGenerator(file_dir=folder, file_list=folder + "/list.csv", dtype=DTYPES)
    dst = str(out / "p.h5")
    temps_seen = 0
    for shards in (1, 3):
        started = time.perf_counter()
        gen.generate(dst, 48, 48, encode="PNG", shards=shards, workers=0)  # the previous pack
        seconds = time.perf_counter() - started
        killed_pids = []
        for kill in range(3):
            # The first kill lands anywhere, from before the first write to after; the second
            # somewhere from its first temporary file on; the last as that file appears, so
            # some kill lands mid-write however slow the machine is.
            if kill:
                proc = _child_writing(folder, dst, shards, str(out))
            else:
                proc = _child(folder, dst, shards)
            if kill < 2:
                time.sleep(rng.uniform(0.0, 1.2 * seconds))
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
            killed_pids.append(proc.pid)
            _check_folder(str(out), dst, shards)
        left = [writer_of(n) for n in os.listdir(out) if is_temp(n)]
        assert {w[1] for w in left if w is not None} <= set(killed_pids)
        temps_seen += len(left)
        gen.generate(dst, 48, 48, encode="PNG", shards=shards, workers=0)  # the next write
        assert not [n for n in os.listdir(out) if is_temp(n)]
        _check_folder(str(out), dst, shards)
        for path in shard_paths(dst, shards):
            os.remove(path)
    assert temps_seen  # the kills mid-write left temporary files the next write swept
