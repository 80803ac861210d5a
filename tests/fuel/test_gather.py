"""Numeric columns served by one gather per batch: the same batches as row by row, and guards.

A Tank with no fetch_fn, prep_fn, collate_fn or preload reads its numeric columns of one
shape with `Pack.take` (dualtrain/fuel/gather.py). A ``prep_fn`` that returns the sample
unchanged turns that off, so the same Tank with it is the row-by-row reference.
"""

from __future__ import annotations

import itertools
import os
import time
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.errors import ArgumentError, PackError
from dualtrain.fuel import FuelGenerator, Pack, Tank
from dualtrain.fuel.casts import check_value as _check_value, first_lost as _first_lost
from tests.fuel.raw import DTYPES, SPEC, make_folder, write_table

STORED = ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
          "float16", "float32", "float64")  # fmt: skip
CELL_SHAPES = st.sampled_from([(), (1,), (3,), (2, 3)])


def unchanged(sample):
    return sample


def values(draw, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Values of `dtype` near its edges and small ones: what casts can lose."""
    size = int(np.prod(shape))
    if dtype.kind == "b":
        return np.asarray(
            draw(st.lists(st.booleans(), min_size=size, max_size=size)), bool
        ).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        pick = st.one_of(st.integers(-3, 3), st.sampled_from([int(info.min), int(info.max)]),
                         st.integers(int(info.min), int(info.max)))  # fmt: skip
        pick = pick.filter(lambda v: info.min <= v <= info.max)
    else:
        pick = st.one_of(st.floats(-4, 4, width=32), st.sampled_from([1e300, -1e300, 65504.0, 7e4]))
    flat = draw(st.lists(pick, min_size=size, max_size=size))
    with np.errstate(over="ignore"):
        wide = np.asarray(flat, dtype=np.float64 if dtype.kind == "f" else object)
        return wide.astype(dtype).reshape(shape)


@st.composite
def tables(draw):
    """Columns of random dtypes and cell shapes, an id column, and served dtypes with casts."""
    rows = draw(st.integers(1, 40))
    count = draw(st.integers(1, 3))
    columns = {"id": np.arange(rows, dtype=np.int64)}
    spec, cast = {"id": "int64"}, {"id": "safe"}
    for k in range(count):
        stored = np.dtype(draw(st.sampled_from(STORED)))
        shape = draw(CELL_SHAPES)
        columns[f"c{k}"] = values(draw, stored, (rows, *shape))
        how = draw(st.sampled_from(["safe", "same_kind", "unsafe"]))
        served = draw(st.sampled_from([s for s in STORED
                                       if np.can_cast(stored, np.dtype(s), how)]))  # fmt: skip
        spec[f"c{k}"], cast[f"c{k}"] = served, how
    return columns, spec, cast


def written(tmp_path, columns, *, kind: str, shards: int) -> list[str] | str:
    """The table as one file or `shards` files (rows split in order), of `kind`."""
    rows = len(columns["id"])
    shards = min(shards, rows)
    bounds = np.linspace(0, rows, shards + 1).astype(int)
    suffix = ".npz" if kind == "npz" else ".h5"
    paths = [
        write_table(
            str(tmp_path / f"t{i}{suffix}"),
            {k: v[lo:hi] for k, v in columns.items()},
            chunked=kind == "chunked",
        )
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds))
    ]
    return paths if shards > 1 else paths[0]


def epoch(tank: Tank) -> list[dict]:
    return [tank.next() for _ in range(tank.batches_per_epoch)]


def outcome(make):
    """The batches of two epochs, or the error's type and message.

    NumPy's cast warnings (cast="unsafe" of inf to an int) are left out here; the warning
    has a test of its own.
    """
    try:
        with make() as tank, warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return epoch(tank) + epoch(tank)
    except (PackError, ArgumentError) as e:
        return type(e), str(e).split("\n")[0]


@settings(max_examples=40, deadline=None)
@given(
    table=tables(),
    kind=st.sampled_from(["h5", "chunked", "npz"]),
    shards=st.integers(1, 3),
    batch=st.integers(1, 9),
    workers=st.sampled_from([0, 2]),
    end=st.sampled_from(["full", "short", "drop", "pad"]),
    shuffle=st.booleans(),
)
def test_gathered_batches_are_the_row_by_row_ones(
    tmp_path_factory, table, kind, shards, batch, workers, end, shuffle
):
    columns, spec, cast = table
    path = written(tmp_path_factory.mktemp("g"), columns, kind=kind, shards=shards)
    ends = {"full": {}, "short": {"in_same_size": False}, "drop": {"drop_last": True},
            "pad": {"pad": True}}[end]  # fmt: skip
    if end == "drop" and len(columns["id"]) < batch:
        ends = {}  # no batch at all: not what this law is about

    def tank(**extra):
        return lambda: Tank(path, spec, batch, shuffle=shuffle, seed=3, workers=workers,
                            cast=cast, **ends, **extra)  # fmt: skip

    got, want = outcome(tank()), outcome(tank(prep_fn=unchanged))
    if isinstance(want, tuple):
        assert got == want  # the same error, naming the same row
        return
    assert isinstance(got, list) and len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert list(g) == list(w)  # the same keys, in the data_specf order
        for key in w:
            assert g[key].dtype == w[key].dtype and g[key].shape == w[key].shape, key
            defined = defined_casts(columns[key][g["id"]] if key in columns else w[key], g[key])
            np.testing.assert_array_equal(g[key][defined], w[key][defined])
        # and each row is the stored row, cast as asked (a checked cast that lost a value
        # is an error above, so here every cast is NumPy's astype)
        for key in spec:
            stored = columns[key][g["id"]]
            with np.errstate(over="ignore", invalid="ignore"):
                cast_ = stored.astype(spec[key])
            defined = defined_casts(stored, cast_)
            np.testing.assert_array_equal(g[key][defined], cast_[defined])


def defined_casts(stored: np.ndarray, served: np.ndarray) -> np.ndarray:
    """Where a cast's result is defined: C leaves a float that is not finite or out of an
    integer type's range undefined (cast="unsafe"), and NumPy's loops then differ by shape."""
    stored = np.asarray(stored)
    if stored.dtype.kind != "f" or served.dtype.kind not in "iub":
        return np.ones(stored.shape, bool)
    if served.dtype.kind == "b":
        return np.isfinite(stored) | np.isinf(stored)  # any value is True or False
    info, wide = np.iinfo(served.dtype), stored.astype(np.float64)
    return np.isfinite(wide) & (wide > float(info.min) - 1) & (wide < float(info.max) + 1)


@given(
    rows=st.lists(st.integers(0, 29), max_size=40),
    shards=st.integers(1, 3),
    kind=st.sampled_from(["h5", "chunked", "npz"]),
)
@settings(max_examples=30, deadline=None)
def test_take_is_the_stack_of_rows(tmp_path_factory, rows, shards, kind):
    x = np.arange(30 * 6, dtype=np.float32).reshape(30, 2, 3)
    columns = {"id": np.arange(30), "x": x}
    pack = Pack(written(tmp_path_factory.mktemp("t"), columns, kind=kind, shards=shards))
    got = pack["x"].take(np.asarray(rows, dtype=np.int64))
    assert got.shape == (len(rows), 2, 3) and got.dtype == np.float32
    want = np.stack([pack["x"][i] for i in rows]) if rows else np.empty((0, 2, 3), np.float32)
    np.testing.assert_array_equal(got, want)
    out = np.full((len(rows), 2, 3), -1, np.float32)
    assert pack["x"].take(rows, out) is out
    np.testing.assert_array_equal(out, want)
    many = pack.take(["id", "x"], rows)
    np.testing.assert_array_equal(many["id"], np.asarray(rows, dtype=np.int64))
    # The Tank's own rows (int64, in range by construction) skip the range pass: the same.
    vouched = pack.take(["id", "x"], np.asarray(rows, dtype=np.int64), in_range=True)
    for key in ("id", "x"):
        np.testing.assert_array_equal(vouched[key], many[key])
    pack.close()


def test_take_refuses_what_it_cannot_gather(tmp_path):
    pack = Pack(write_table(str(tmp_path / "t.h5"), {"x": np.arange(5.0)}))
    with pytest.raises(IndexError, match="row 5 is out of range for a pack of 5 rows"):
        pack["x"].take([0, 5])
    with pytest.raises(IndexError, match="row -1 is out of range"):
        pack["x"].take(np.array([-1, 2]))
    with pytest.raises(ArgumentError, match="rows"):
        pack["x"].take(np.zeros((2, 2), np.int64))
    with pytest.raises(ArgumentError, match="rows"):
        pack["x"].take([0.5])
    # Vouching covers int64 arrays only: rows of another kind are checked whatever it says.
    for rows in ([0, 5], np.array([-1, 2], np.int32)):
        with pytest.raises(IndexError, match="out of range"):
            pack.take(["x"], rows, in_range=True)
    folder = tmp_path / "raw"
    make_folder(str(folder), 4)
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    images = Pack(gen.generate(str(tmp_path / "p.h5"), 12, 16, encode="PNG", workers=0).paths)
    for key in ("image", "tags", "name"):
        with pytest.raises(ArgumentError, match="numeric column of one shape"):
            images[key].take([0])
    np.testing.assert_array_equal(images["box"].take([1, 1]), [images["box"][1]] * 2)


def test_a_mixed_pack_gathers_numbers_and_decodes_images_row_by_row(tmp_path):
    folder = tmp_path / "raw"
    make_folder(str(folder), 11)
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    paths = gen.generate(str(tmp_path / "p.h5"), 12, 16, encode="PNG", workers=0).paths
    for workers in (0, 2):
        got = epoch(Tank(paths, SPEC, 4, seed=1, workers=workers))
        want = epoch(Tank(paths, SPEC, 4, seed=1, workers=workers, prep_fn=unchanged))
        for g, w in zip(got, want, strict=True):
            assert list(g) == list(SPEC)
            for key in SPEC:
                if isinstance(w[key], list):
                    assert len(g[key]) == len(w[key])
                    for a, b in zip(g[key], w[key], strict=True):
                        np.testing.assert_array_equal(a, b)
                else:
                    assert g[key].dtype == w[key].dtype
                    np.testing.assert_array_equal(g[key], w[key])


def test_process_workers_gather_the_same_batches(tmp_path):
    x = np.arange(50 * 3, dtype=np.int64).reshape(50, 3)
    path = write_table(str(tmp_path / "t.h5"), {"x": x, "y": np.arange(50, dtype=np.int16)})
    spec = {"x": "int32", "y": "float32"}
    got = epoch(Tank(path, spec, 8, seed=2, workers=2, worker_mode="process", cast="same_kind"))
    want = epoch(Tank(path, spec, 8, seed=2, workers=0, prep_fn=unchanged, cast="same_kind"))
    for g, w in zip(got, want, strict=True):
        for key in spec:
            assert g[key].dtype == w[key].dtype
            np.testing.assert_array_equal(g[key], w[key])
            assert g[key].ctypes.data % 64 == 0  # aligned for JAX's zero-copy import


def test_a_value_lost_by_a_cast_names_its_row_as_row_by_row_reading_does(tmp_path):
    label = np.zeros(20, np.int64)
    label[13] = 300
    path = write_table(str(tmp_path / "t.h5"), {"label": label})
    for extra in ({}, {"prep_fn": unchanged}):
        tank = Tank(path, {"label": "int8"}, 20, shuffle=False, cast="same_kind", **extra)
        with pytest.raises(PackError, match="column 'label', row 13: the stored int64 value 300"):
            tank.next()


@pytest.mark.parametrize(("gathered_row", "by_row_row", "first"), [
    (2, 5, "column 'a', row 2"),  # the gathered column's row comes first
    (5, 2, "column 'v', row 2"),  # the row-by-row column's row comes first
    (3, 3, "column 'a', row 3"),  # one row: the column first in data_specf
])  # fmt: skip
def test_errors_come_in_row_by_row_order_whatever_reads_the_column(
    tmp_path, gathered_row, by_row_row, first
):
    a = np.zeros(12, np.int64)
    a[gathered_row] = 300
    cells = [np.zeros(1 + i % 2, np.int64) for i in range(12)]
    cells[by_row_row][-1] = 300
    paths = write_table(str(tmp_path / "p.h5"), {"a": a, "v": cells})
    spec = {"a": "int8", "v": "vint8"}
    for extra in ({}, {"prep_fn": unchanged}):
        tank = Tank(paths, spec, 8, shuffle=False, cast="same_kind", **extra)
        with pytest.raises(PackError, match=first) as caught:
            tank.next()
        row = int(first.rsplit(" ", 1)[1])
        assert f"while preparing row {row} of epoch 0" in caught.value.__notes__


def test_a_gather_guards_each_read(tmp_path):
    path = write_table(str(tmp_path / "t.h5"), {"x": np.arange(40.0)})
    pack = Pack(path)
    pack["x"].take([1, 2])
    with open(path, "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b"\0")
    time.sleep(0.002)  # past the guard's millisecond
    with pytest.raises(PackError, match="changed since it was opened"):
        pack["x"].take([3])


def test_an_unsafe_cast_warns_as_numpy_astype_does(tmp_path):
    path = write_table(str(tmp_path / "t.h5"), {"x": np.array([1.0, np.inf, np.nan])})
    for extra in ({}, {"prep_fn": unchanged}):
        tank = Tank(path, {"x": "int32"}, 3, shuffle=False, cast="unsafe", **extra)
        with pytest.warns(RuntimeWarning, match="invalid value encountered in cast"):
            batch = tank.next()
        assert batch["x"][0] == 1


def test_a_pack_rewritten_under_a_gathering_tank_is_an_error(tmp_path):
    path = write_table(str(tmp_path / "t.h5"), {"x": np.arange(40.0)})
    tank = Tank(path, {"x": "float64"}, 8, seed=0)
    tank.next()
    with open(path, "r+b") as f:  # rewritten in place: the size stays, the mtime moves
        f.seek(0, os.SEEK_END)
        f.write(b"\0")
    with pytest.raises(PackError, match="changed since it was opened"):
        tank.next()


CAST_PAIRS = [(a, b) for a in STORED for b in STORED
              if np.can_cast(np.dtype(a), np.dtype(b), "same_kind")]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(pair=st.sampled_from(CAST_PAIRS), data=st.data())
def test_the_batch_check_is_the_row_check(pair, data):
    stored_t, served_t = np.dtype(pair[0]), np.dtype(pair[1])
    rows = data.draw(st.integers(1, 6))
    stored = values(data.draw, stored_t, (rows, 2))
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.empty(stored.shape, served_t)
        np.copyto(out, stored, casting="unsafe")
    ids = np.arange(100, 100 + rows)

    def by_row():
        for j in range(rows):
            _check_value("c", int(ids[j]), stored[j], out[j])

    def batch():
        first = _first_lost(ids, stored, out)
        if first is not None:
            _check_value("c", int(ids[first]), stored[first], out[first])

    results = []
    for check in (by_row, batch):
        try:
            check()
            results.append(None)
        except PackError as e:
            results.append(str(e))
    assert results[0] == results[1]
