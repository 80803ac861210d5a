"""The framework-free parts of a sharded embedding anchor: which chunks a rank reads, part
names, and gathering every rank's outcome over the exchange."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.checkpoint.anchor_names import newest
from dualtrain.checkpoint.embedding_sets import gather, part_files, part_name, pieces
from dualtrain.embeddings.sharding import split
from tests.embeddings.thread_ranks import run_ranks, unwrap


@st.composite
def ranges(draw):
    """A part's ids [start, stop), its chunk size, and a reader's ids [lo, hi)."""
    n = draw(st.integers(1, 60))
    start = draw(st.integers(0, n))
    stop = draw(st.integers(start, n))
    lo = draw(st.integers(0, n))
    hi = draw(st.integers(lo, n))
    return start, stop, draw(st.integers(1, 9)), lo, hi


@given(ranges())
def test_pieces_hold_exactly_the_shared_ids(case):
    start, stop, chunk, lo, hi = case
    got = []
    for p in pieces(start, stop, chunk, lo, hi):
        first = start + p.chunk * chunk  # the chunk's first id
        assert 0 <= p.begin < p.end <= min(chunk, stop - first)
        ids = range(first + p.begin, first + p.end)
        assert ids.start - lo == p.at  # lands where the reader keeps that id
        got.extend(ids)
    assert got == sorted(set(range(start, stop)) & set(range(lo, hi)))


@given(st.integers(1, 50), st.integers(1, 5), st.integers(1, 5), st.integers(1, 7))
def test_every_reader_gets_every_row_once_from_any_writer_world(num_rows, written, read, chunk):
    """A table written by `written` ranks, read by `read` ranks: each id arrives once."""
    wb, rb = split(num_rows, written), split(num_rows, read)
    seen = np.zeros(num_rows, np.int64)
    for r in range(read):
        lo, hi = int(rb[r]), int(rb[r + 1])
        for w in range(written):
            for p in pieces(int(wb[w]), int(wb[w + 1]), chunk, lo, hi):
                seen[lo + p.at : lo + p.at + p.end - p.begin] += 1
    assert (seen == 1).all()


def test_part_names_stay_out_of_numbering_and_are_found(tmp_path: Path):
    path = tmp_path / "emb.safetensors"
    names = [part_name(path, r, 3, "0123abcd") for r in range(3)]
    assert names[1] == "emb%r1of3.0123abcd.safetensors"
    for name in [*names, "emb-2.safetensors", "other%r0of1.0123abcd.safetensors"]:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in part_files(path)] == names
    assert newest(tmp_path, "emb").name == "emb-2.safetensors"  # parts are not numbered


@settings(deadline=None, max_examples=20)
@given(st.integers(1, 4), st.data())
def test_gather_gives_every_rank_every_value(world, data):
    values = [data.draw(st.dictionaries(st.text(max_size=3), st.integers())) for _ in range(world)]
    out = unwrap(run_ranks(world, lambda rank, ex: gather(ex, values[rank])))
    assert out == [values] * world


def test_a_rank_that_fails_outside_the_exchange_breaks_the_others_barrier():
    """The helper itself never leaves ranks waiting: the test run ends with an error."""

    def fn(rank, ex):
        if rank == 1:
            raise ValueError("rank 1 broke")
        return gather(ex, rank)

    out = run_ranks(2, fn)
    assert isinstance(out[0], threading.BrokenBarrierError)
    with pytest.raises(ValueError, match="rank 1 broke"):
        unwrap(out)
