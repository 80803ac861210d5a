"""A sharded store's anchor set, written and read by "ranks" that are threads of this process
(tests.embeddings.thread_ranks): any world size loads what any other wrote, all or nothing,
and a write cut short never loads and is cleaned up by the next."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dualtrain import ArgumentError, CheckpointError, EmbeddingStore, TimeMachine, atomic
from dualtrain.checkpoint.anchor_file import Anchor
from dualtrain.checkpoint.embedding_sets import part_files, save_set
from tests.embeddings.thread_ranks import run_ranks, unwrap

torch = pytest.importorskip("torch")
from dualtrain_torch import attach  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
DIM = 2
SLOTS = ("exp_avg", "exp_avg_sq")


def truth(num_rows: int, seed: int, step: int = 5) -> dict:
    """Every table of a whole store (as one unsharded process would hold it), and its step."""
    rng = np.random.default_rng(seed)
    return {
        "weight": rng.standard_normal((num_rows, DIM)).astype(np.float32),
        "exp_avg": rng.standard_normal((num_rows, DIM)).astype(np.float32),
        "exp_avg_sq": rng.random((num_rows, DIM)).astype(np.float32),
        "counters": rng.integers(0, step + 1, num_rows),
        "step": step,
    }


def shard_rows(rank, world, exchange, num_rows, mode, seed=11):
    store = EmbeddingStore(num_rows, DIM, seed=seed)
    store.make_shard(rank, world, exchange)  # world 1: stays an ordinary store
    return attach(store, torch.optim.Adam, mode=mode, lr=0.1)


def fill(rows, whole: dict) -> None:
    """Sets this rank's rows of every table to `whole`'s, and the step count."""
    store = rows.store
    a, b = store.rows.start, store.rows.stop
    table, state, counters = store.live()
    table[...] = whole["weight"][a:b]
    for slot in SLOTS:
        state[slot][...] = whole[slot][a:b]
    if counters is not None:
        counters[...] = whole["counters"][a:b]
    rows.session.t = whole["step"]


def write(folder: Path, world: int, whole: dict, mode: str, chunk=None, name="emb", **kw):
    """`world` ranks drop `whole` (each its rows); every rank's result or exception."""

    def one(rank, ex):
        rows = shard_rows(rank, world, ex, len(whole["weight"]), mode)
        fill(rows, whole)
        if chunk is not None and rows.store.shard is not None:
            return save_set(rows, folder / f"{name}.safetensors", kw.get("extra"), chunk)
        return TimeMachine(save_path=folder).drop_embeddings(rows, name, **kw)

    return run_ranks(world, one)


def read(folder: Path, world: int, num_rows: int, mode: str, name="emb"):
    """`world` fresh ranks load `name`; each rank's rows, tables and step (or exception)."""

    def one(rank, ex):
        rows = shard_rows(rank, world, ex, num_rows, mode, seed=99)
        store = rows.store
        before = store.table.copy()
        try:
            TimeMachine(save_path=folder).to_embeddings(rows, name)
        except Exception as err:
            assert np.array_equal(store.table, before)  # a failed load changes nothing
            raise err
        return {
            "rows": store.rows,
            "weight": store.table.copy(),
            **{slot: store.state[slot].copy() for slot in SLOTS},
            "counters": None if store.counters is None else store.counters.copy(),
            "step": rows.steps,
        }

    return run_ranks(world, one)


def check_loaded(got: list, whole: dict, saved_mode: str, mode: str) -> None:
    covered = 0
    for part in unwrap(got):
        a, b = part["rows"].start, part["rows"].stop
        covered += b - a
        for name in ("weight", *SLOTS):
            np.testing.assert_array_equal(part[name], whole[name][a:b])
        assert part["step"] == whole["step"]
        if mode == "lazy":
            assert part["counters"] is None
        elif saved_mode == "exact":
            np.testing.assert_array_equal(part["counters"], whole["counters"][a:b])
        else:  # a lazy run's rows count as current
            assert (part["counters"] == whole["step"]).all()
    assert covered == len(whole["weight"])


@settings(
    deadline=None, max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    num_rows=st.integers(1, 9),
    written=st.integers(1, 4),
    read_by=st.integers(1, 4),
    modes=st.sampled_from(
        [("exact", "exact"), ("lazy", "lazy"), ("exact", "lazy"), ("lazy", "exact")]
    ),
    chunk=st.one_of(st.none(), st.integers(1, 4)),
    seed=st.integers(0, 2**16),
)
def test_a_set_written_by_any_world_loads_into_any_world(
    tmp_path_factory, num_rows, written, read_by, modes, chunk, seed
):
    folder = tmp_path_factory.mktemp("set")
    whole = truth(num_rows, seed)
    saved_mode, mode = modes
    paths = unwrap(write(folder, written, whole, saved_mode, chunk))
    assert len(set(paths)) == 1 and paths[0] == folder / "emb.safetensors"
    check_loaded(read(folder, read_by, num_rows, mode), whole, saved_mode, mode)


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_new_set_replaces_the_old_one_and_removes_its_parts(tmp_path):
    first, second = truth(7, 1), truth(7, 2, step=9)
    unwrap(write(tmp_path, 2, first, "exact"))
    old = listing(tmp_path)
    unwrap(write(tmp_path, 3, second, "exact", extra={"epoch": 4}))
    new = listing(tmp_path)
    assert len(new) == 4 and not set(new) & (set(old) - {"emb.safetensors"})
    check_loaded(read(tmp_path, 2, 7, "exact"), second, "exact", "exact")
    unwrap(write(tmp_path, 1, first, "exact"))  # a single file over the set: parts go too
    assert listing(tmp_path) == ["emb.safetensors"]
    check_loaded(read(tmp_path, 3, 7, "exact"), first, "exact", "exact")


def test_an_error_on_one_rank_is_raised_on_every_rank_and_nothing_is_left(tmp_path):
    whole = truth(6, 3)

    def one(rank, ex):
        rows = shard_rows(rank, 2, ex, 6, "lazy")
        fill(rows, whole)
        extra = {1: "int key"} if rank == 1 else {}
        return TimeMachine(save_path=tmp_path).drop_embeddings(rows, "emb", extra=extra)

    zero, first = run_ranks(2, one)
    assert isinstance(first, ArgumentError) and "has the key 1" in str(first)
    assert isinstance(zero, CheckpointError)
    assert "rank 1 failed to write the embedding anchor: ArgumentError" in str(zero)
    assert listing(tmp_path) == []


def test_a_manifest_that_cannot_be_written_fails_every_rank_and_removes_the_parts(tmp_path):
    (tmp_path / "emb.safetensors").mkdir()  # rank 0 cannot rename its manifest onto it
    out = write(tmp_path, 3, truth(5, 4), "exact")
    assert isinstance(out[0], OSError)
    for other in out[1:]:
        assert isinstance(other, CheckpointError)
        assert "rank 0 failed to write the embedding anchor's manifest" in str(other)
    assert listing(tmp_path) == ["emb.safetensors"]  # the folder; no part, no temporary file


def test_a_load_that_fails_on_one_rank_changes_no_rank(tmp_path):
    whole = truth(8, 5)
    unwrap(write(tmp_path, 2, whole, "exact"))
    last = part_files(tmp_path / "emb.safetensors")[-1]  # ids 4..7: rank 1's of 2
    data = bytearray(last.read_bytes())
    data[-3] ^= 0xFF  # a flipped bit in the data: the part's CRC-32C catches it
    last.write_bytes(bytes(data))
    zero, first = read(tmp_path, 2, 8, "exact")  # each asserts its table did not change
    assert isinstance(first, CheckpointError) and "fails its CRC-32C check" in str(first)
    assert isinstance(zero, CheckpointError) and "rank 1 failed to load" in str(zero)


def test_a_missing_or_foreign_part_and_a_mismatched_shape_are_refused_clearly(tmp_path):
    unwrap(write(tmp_path, 2, truth(8, 6), "exact"))
    (other := tmp_path / "other").mkdir()
    unwrap(write(other, 2, truth(8, 7), "exact"))
    with pytest.raises(CheckpointError, match=r"holds a 8 x 2 table; this store is 9 x 2"):
        unwrap(read(tmp_path, 2, 9, "exact"))
    mine, theirs = part_files(tmp_path / "emb.safetensors"), part_files(other / "emb.safetensors")
    os.replace(theirs[0], mine[0])  # the name of this set's part, another write's bytes
    with pytest.raises(CheckpointError, match=r"a part of another write"):
        unwrap(read(tmp_path, 1, 8, "exact"))
    mine[1].unlink()
    zero, first = read(tmp_path, 2, 8, "exact")  # each rank reads only its own part
    assert "a part of another write" in str(zero)
    assert re.search(r"names the part emb%r1of2\..*which is not in", str(first))


# A writer killed (os._exit, as by SIGKILL) as its `die_after`-th exchange returns: after the
# second (the first agrees on the set's name), every rank's part is a temporary file; after
# the third, every part is renamed into place and rank 0 has not written the manifest.
KILLED = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.checkpoint.torch.test_embedding_sets import shard_rows, fill, truth
    from tests.embeddings.thread_ranks import run_ranks
    from dualtrain import TimeMachine

    folder, die_after = Path(sys.argv[1]), int(sys.argv[2])
    def one(rank, ex):
        ex.die_after = die_after
        rows = shard_rows(rank, 2, ex, 7, "exact")
        fill(rows, truth(7, 8))
        TimeMachine(save_path=folder).drop_embeddings(rows, "emb")
    run_ranks(2, one)
    """
)


def kill_mid_write(folder: Path, die_after: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(folder), str(die_after)], env=env, cwd=ROOT, timeout=120
    )
    assert done.returncode == 9


def test_a_write_killed_before_its_manifest_never_loads_and_the_next_write_cleans_up(tmp_path):
    kill_mid_write(tmp_path, 3)
    parts = part_files(tmp_path / "emb.safetensors")
    assert len(parts) == 2 and not (tmp_path / "emb.safetensors").exists()
    with pytest.raises(CheckpointError, match=r"2 part file\(s\).*did not finish"):
        unwrap(read(tmp_path, 2, 7, "exact"))
    whole = truth(7, 9)
    unwrap(write(tmp_path, 2, whole, "exact"))
    assert len(listing(tmp_path)) == 3 and not set(parts) & set(tmp_path.iterdir())
    check_loaded(read(tmp_path, 3, 7, "exact"), whole, "exact", "exact")


def test_a_write_killed_mid_way_leaves_the_older_set_loading_whole(tmp_path):
    whole = truth(7, 10)
    unwrap(write(tmp_path, 2, whole, "exact"))
    kill_mid_write(tmp_path, 2)  # temporary files of the dead writer, beside the old set
    assert any(atomic.is_temp(p) for p in tmp_path.iterdir())
    check_loaded(read(tmp_path, 2, 7, "exact"), whole, "exact", "exact")
    kill_mid_write(tmp_path, 3)  # parts of an unfinished set, beside the old set
    assert len(part_files(tmp_path / "emb.safetensors")) == 4
    check_loaded(read(tmp_path, 1, 7, "exact"), whole, "exact", "exact")
    unwrap(write(tmp_path, 3, whole, "exact"))
    assert len(listing(tmp_path)) == 4  # the manifest and its 3 parts: the rest swept


def test_each_rank_reads_only_the_chunks_over_its_own_ids(tmp_path):
    """Parts [0, 4) and [4, 8) in chunks of 2 rows, read by 3 ranks ([0, 3), [3, 6), [6, 8)):
    a damaged chunk of ids 6..7 fails rank 2 alone; ranks 0 and 1 never read it, so they
    fail only because rank 2 did (no rank writes a row unless every rank can)."""
    unwrap(write(tmp_path, 2, truth(8, 13), "exact", chunk=2))
    last = part_files(tmp_path / "emb.safetensors")[1]
    entry = Anchor(last).entries["weight.1"]  # ids 6..7
    data = bytearray(last.read_bytes())
    data[entry.begin] ^= 0xFF
    last.write_bytes(bytes(data))
    out = read(tmp_path, 3, 8, "exact")
    assert "tensor 'weight.1' fails its CRC-32C check" in str(out[2])
    for other in out[:2]:
        assert isinstance(other, CheckpointError) and "rank 2 failed to load" in str(other)


def test_ranks_writing_to_different_files_are_refused_before_any_part(tmp_path):
    whole = truth(6, 3)

    def one(rank, ex):
        rows = shard_rows(rank, 2, ex, 6, "lazy")
        fill(rows, whole)
        return TimeMachine(save_path=tmp_path / f"rank{rank}").drop_embeddings(rows, "emb")

    results = run_ranks(2, one)
    for result in results:
        assert isinstance(result, CheckpointError), result
        assert "different files" in str(result)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))
