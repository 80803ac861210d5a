"""XLA's compiled programs kept under dualtrain's cache folder (dualtrain_jax.compilation.cache).

Each run is a fresh process (JAX reads its cache settings once per process): the first
accelerated call compiles and writes an entry, a second process reads it back instead of
compiling; a folder the user named, and JAX's own off switch, are left alone; an entry a
killed writer left truncated is dropped before JAX would trip over it on every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from dualtrain_jax.compilation.cache import drop_torn_entries

RUN = """
import json, sys
import jax, jax.numpy as jnp
from jax._src import monitoring
events = []
monitoring.register_event_listener(lambda name, **kw: events.append(name))
import dualtrain_jax
def step(x):
    return jnp.tanh(x @ x.T).sum()
fast = dualtrain_jax.accelerate(step, backends="jit")
value = float(fast(jnp.ones((8, 8))))
print(json.dumps({"value": value, "dir": jax.config.jax_compilation_cache_dir,
                  "hits": events.count("/jax/compilation_cache/cache_hits")}))
"""


def run(tmp_path: Path, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    environ.update(
        DUALTRAIN_CACHE_DIR=str(tmp_path / "home"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",  # keep every program, however quick
        JAX_PLATFORMS="cpu",
        **env,
    )
    done = subprocess.run(
        [sys.executable, "-c", RUN], env=environ, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["stderr"] = done.stderr
    return out


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*-cache")) if folder.is_dir() else []


def test_a_second_run_reads_what_the_first_compiled(tmp_path: Path) -> None:
    folder = tmp_path / "home" / "xla"
    first = run(tmp_path)
    assert first["dir"] == str(folder) and first["hits"] == 0
    assert entries(folder), "the first run kept nothing"
    second = run(tmp_path)
    assert second["hits"] >= 1, "the second run compiled again"
    assert second["value"] == first["value"]


def test_a_folder_the_user_named_and_the_off_switch_are_left_alone(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    named = run(tmp_path, JAX_COMPILATION_CACHE_DIR=str(mine))
    assert named["dir"] == str(mine) and entries(mine)
    off = run(tmp_path, JAX_ENABLE_COMPILATION_CACHE="false")
    assert off["dir"] is None
    assert not entries(tmp_path / "home" / "xla")


OP_BY_OP = """
import json, threading
import jax, jax.numpy as jnp
from jax._src import config, monitoring
events = []
monitoring.register_event_listener(lambda name, **kw: events.append(name))
import dualtrain_jax
from dualtrain_jax.compilation.cache import every_program_kept
threshold = config.persistent_cache_min_compile_time_secs
def step(x):
    return (jnp.sin(x) * 2.0 + jnp.cos(x)).sum()
# budget=inf: the whole ladder now, so op by op runs here; no decision cache: every run
fast = dualtrain_jax.accelerate(step, budget=float("inf"), cache=False)
value = float(fast(jnp.ones(5)))
seen = {}
with every_program_kept():
    seen["inside"] = threshold.value
    other = threading.Thread(target=lambda: seen.setdefault("other", threshold.value))
    other.start()
    other.join()
seen["after"] = threshold.value
print(json.dumps({"value": value, "dir": jax.config.jax_compilation_cache_dir,
                  "hits": events.count("/jax/compilation_cache/cache_hits"), **seen}))
"""


def run_op_by_op(tmp_path: Path, **env: str) -> dict:
    """OP_BY_OP in a fresh process, under JAX's default threshold (1 s) unless `env` says."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    environ.update(DUALTRAIN_CACHE_DIR=str(tmp_path / "home"), JAX_PLATFORMS="cpu", **env)
    done = subprocess.run(
        [sys.executable, "-c", OP_BY_OP], env=environ, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_op_by_op_programs_are_kept_however_quick_and_read_by_the_next_run(
    tmp_path: Path,
) -> None:
    """The reference's one-primitive programs (milliseconds each, under JAX's 1 s threshold)
    are kept, so a check a short job could not finish goes faster in the next run; the
    threshold is lowered for the checking thread only, and only in dualtrain's folder."""
    folder = tmp_path / "home" / "xla"
    first = run_op_by_op(tmp_path)
    assert first["dir"] == str(folder)
    assert (first["inside"], first["other"], first["after"]) == (0.0, 1.0, 1.0)
    kept = entries(folder)
    assert len(kept) >= 3, "op by op's programs were not kept"  # sin, cos, mul, add, sum...
    second = run_op_by_op(tmp_path)
    assert second["hits"] >= len(kept) - 1 and second["value"] == first["value"]
    mine = run_op_by_op(tmp_path, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "mine"))
    assert mine["inside"] == 1.0  # the user's cache, the user's threshold
    assert not entries(tmp_path / "mine")  # nothing took a second to compile
    raised = run_op_by_op(tmp_path, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="5")
    assert raised["inside"] == 5.0  # a threshold the user chose is left alone too


def test_an_entry_a_killed_writer_truncated_is_dropped_and_rewritten(tmp_path: Path) -> None:
    folder = tmp_path / "home" / "xla"
    run(tmp_path)
    wholes = {entry: entry.read_bytes() for entry in entries(folder)}
    for entry, whole in wholes.items():
        entry.write_bytes(whole[: len(whole) // 2])  # what kill -9 mid-write leaves
    again = run(tmp_path)
    assert "Error reading persistent compilation cache" not in again["stderr"]
    assert again["hits"] == 0
    # dropped, then written whole by what compiled again (the chosen rung's program at
    # least; the ladder's op-by-op reference is not run again: its decision is cached)
    assert set(entries(folder)) & set(wholes)
    for entry in entries(folder):
        decompressed(entry.read_bytes())
    assert run(tmp_path)["hits"] >= 1


def compressed(payload: bytes) -> bytes:
    from jax._src import compilation_cache  # the codec JAX writes its entries with

    return compilation_cache.compress_executable(payload)


def decompressed(data: bytes) -> bytes:
    from jax._src import compilation_cache

    return compilation_cache.decompress_executable(data)


@settings(max_examples=30, deadline=None)
@given(payload=st.binary(min_size=64, max_size=4096), cut=st.floats(0.0, 0.99))
def test_every_truncation_is_dropped_and_whole_entries_kept(
    tmp_path_factory: pytest.TempPathFactory, payload: bytes, cut: float
) -> None:
    folder = tmp_path_factory.mktemp("xla")
    whole = compressed(payload)
    (folder / "whole-cache").write_bytes(whole)
    (folder / "torn-cache").write_bytes(whole[: int(len(whole) * cut)])
    (folder / "other.txt").write_bytes(b"not an entry")
    dropped = drop_torn_entries(folder)
    assert dropped == [folder / "torn-cache"]
    assert sorted(p.name for p in folder.iterdir()) == [
        ".dualtrain-checked", "other.txt", "whole-cache"
    ]  # fmt: skip
    assert zlib.crc32((folder / "whole-cache").read_bytes()) == zlib.crc32(whole)


def test_entries_checked_once_are_not_read_again(tmp_path: Path) -> None:
    """Only entries newer than the last check are read (start-up stays cheap)."""
    whole = compressed(b"x" * 256)
    old = tmp_path / "old-cache"
    old.write_bytes(whole[:10])  # torn, but older than the stamp: left (checked before)
    os.utime(old, (1_000_000, 1_000_000))
    drop_torn_entries(tmp_path)
    assert not old.exists(), "a first check reads every entry"
    old.write_bytes(whole[:10])
    os.utime(old, (1_000_000, 1_000_000))
    assert drop_torn_entries(tmp_path) == [] and old.exists()
