"""What a Tank serves: one epoch's rows (pad-and-mask, drop_last), checked casts, image
layouts and scales, and arguments refused at construction (issue 11: 10, 11, 12, 17)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import ArgumentError, DtypeError, PackError
from dualtrain.fuel import FuelGenerator, Tank
from dualtrain.fuel.order import EpochOrder
from tests.fuel.raw import DTYPES, make_folder, picture, write_csv

N = 80


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """80 rows (names "item i"), 8x8 RGB PNGs."""
    folder = tmp_path_factory.mktemp("raw")
    make_folder(str(folder), N, size=(8, 8))
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    return gen.generate(str(folder / "p.h5"), 8, 8, encode="PNG", shards=2, workers=0).paths


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """Columns of many dtypes: small int16 (row 1 holds 300), wide float64, signed int64
    (row 2 holds -1), real float32, flag bool, word str."""
    folder = tmp_path_factory.mktemp("typed")
    from PIL import Image

    rows = [["image", "small", "wide", "signed", "real", "flag", "word"]]
    for i in range(6):
        Image.fromarray(picture(i, 6, 6)).save(os.path.join(folder, f"{i}.png"))
        small = 300 if i == 1 else i
        signed = -1 if i == 2 else 2**40 if i == 3 else i
        rows.append([f"{i}.png", str(small), str(0.1 * i), str(signed), str(i / 2),
                     str(i % 2), f"w{i}"])  # fmt: skip
    write_csv(os.path.join(folder, "list.csv"), rows)
    dtype = ["vuint8", "int16", "float64", "int64", "float32", "bool", "str"]
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=dtype)
    return gen.generate(str(folder / "t.h5"), 6, 6, encode="PNG", workers=0).paths


def names_of(batches, mask_key=None) -> list[str]:
    out = []
    for b in batches:
        keep = b[mask_key] if mask_key else [True] * len(b["name"])
        out += [n for n, k in zip(b["name"], keep, strict=True) if k]
    return out


# --- 11: what one epoch serves --------------------------------------------------------------


def test_the_default_fills_and_says_so(pack):
    tank = Tank(pack, {"name": "str"}, 32)
    counts = (len(tank), tank.batches_per_epoch, tank.rows_per_epoch, tank.samples_per_epoch)
    assert counts == (80, 3, 80, 96)
    served = names_of(tank)
    assert len(served) == 96 and len(set(served)) == 80  # the fill repeats 16 rows


def test_pad_and_mask_serves_every_row_once_in_full_batches(pack):
    tank = Tank(pack, {"image": "uint8", "name": "str"}, 32, pad=True, shuffle=False)
    assert (tank.batches_per_epoch, tank.rows_per_epoch, tank.samples_per_epoch) == (3, 80, 96)
    batches = list(tank)
    assert [b["image"].shape for b in batches] == [(32, 8, 8, 3)] * 3  # one shape
    assert [b["mask"].dtype for b in batches] == [np.bool_] * 3
    assert [int(b["mask"].sum()) for b in batches] == [32, 32, 16]
    assert sorted(names_of(batches, "mask")) == sorted(f"item {i}" for i in range(N))
    named = Tank(pack, {"name": "str"}, 32, pad="valid")
    assert int(sum(b["valid"].sum() for b in named)) == N


def test_drop_last_serves_whole_batches_only(pack):
    tank = Tank(pack, {"name": "str"}, 32, drop_last=True)
    assert (tank.batches_per_epoch, tank.rows_per_epoch, tank.samples_per_epoch) == (2, 64, 64)
    served = names_of(tank)
    assert len(served) == len(set(served)) == 64
    with pytest.raises(ArgumentError, match="batch_size"):
        Tank(pack, {"name": "str"}, 81, drop_last=True)
    with pytest.raises(ArgumentError, match="drop_last and pad"):
        Tank(pack, {"name": "str"}, 8, drop_last=True, pad=True)


def test_pad_and_mask_over_ranks_serves_every_row_once(pack):
    tanks = [Tank(pack, {"name": "str"}, 8, pad=True, rank=r, world=3, seed=5) for r in range(3)]
    assert {t.batches_per_epoch for t in tanks} == {4}  # ceil(ceil(80 / 3) / 8): every rank in step
    served = [n for t in tanks for n in names_of(t, "mask")]
    assert sorted(served) == sorted(f"item {i}" for i in range(N))


@pytest.mark.parametrize("to", ["torch", "jax"])
def test_the_mask_reaches_the_framework(pack, to):
    pytest.importorskip(to)
    tank = Tank(pack, {"label": "int32"}, 32, pad=True, to=to, cast="same_kind")
    last = list(tank)[-1]
    assert int(np.asarray(last["mask"]).sum()) == 16 and np.asarray(last["mask"]).dtype == bool


def test_the_mask_key_does_not_clash(pack):
    with pytest.raises(ArgumentError, match="pad"):
        Tank(pack, {"name": "str"}, 8, pad="label")  # a pack column
    with pytest.raises(ArgumentError, match="pad"):
        Tank(pack, {"name": "str"}, 8, pad="")

    def adds_mask(sample):
        return {**sample, "mask": 1}

    tank = Tank(pack, {"name": "str"}, 8, pad=True, prep_fn=adds_mask)
    with pytest.raises(ArgumentError, match="'mask'"):
        tank.next()


def test_resuming_keeps_the_end_mode(pack):
    tank = Tank(pack, {"name": "str"}, 32, pad=True)
    tank.next()
    state = tank.state_dict()
    assert state["last"] == "pad"
    with pytest.raises(ArgumentError, match="last"):
        Tank(pack, {"name": "str"}, 32).load_state_dict(state)
    old = {k: v for k, v in state.items() if k != "last"}  # a state saved before "last"
    resumed = Tank(pack, {"name": "str"}, 32, pad=True)
    resumed.load_state_dict(old)
    assert resumed.position == 1


@settings(max_examples=80)
@given(
    n=st.integers(1, 120), batch=st.integers(1, 40), world=st.integers(1, 8),
    shuffle=st.booleans(), seed=st.integers(0, 2**40), epoch=st.integers(0, 3),
)  # fmt: skip
def test_pad_and_mask_law_each_row_exactly_once(n, batch, world, shuffle, seed, epoch):
    if n < world:
        return
    orders = [EpochOrder(n, batch, shuffle=shuffle, seed=seed, rank=r, world=world, last="pad")
              for r in range(world)]  # fmt: skip
    assert len({o.batches for o in orders}) == 1  # the ranks step together
    real = []
    for o in orders:
        for b in range(o.batches):
            rows, valid = o.batch(epoch, b), o.valid(b)
            assert len(rows) == len(valid) == batch  # one shape
            assert set(rows.tolist()) <= set(range(n))
            real += rows[valid].tolist()
        assert sum(int(o.valid(b).sum()) for b in range(o.batches)) == o.rows_per_epoch
    assert sorted(real) == list(range(n))


@settings(max_examples=60)
@given(
    n=st.integers(1, 120), batch=st.integers(1, 40), world=st.integers(1, 4),
    seed=st.integers(0, 2**40),
)  # fmt: skip
def test_drop_last_law_whole_batches_no_repeats(n, batch, world, seed):
    if n < world:
        return
    if n // world < batch:
        with pytest.raises(ArgumentError, match="batch_size"):
            EpochOrder(n, batch, shuffle=True, seed=seed, rank=0, world=world, last="drop")
        return
    served = []
    for r in range(world):
        o = EpochOrder(n, batch, shuffle=True, seed=seed, rank=r, world=world, last="drop")
        batches = [o.batch(0, b) for b in range(o.batches)]
        assert all(len(b) == batch for b in batches) and o.batches == n // world // batch
        served += np.concatenate(batches).tolist()
    assert len(served) == len(set(served))


# --- 10: casts are checked ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "wanted"),
    [
        ("small", "int8"),  # int16 300 as int8
        ("small", "uint16"),  # int as uint
        ("wide", "float16"),
        ("wide", "float32"),
        ("signed", "uint64"),
        ("signed", "int32"),
        ("real", "int32"),  # float as int
        ("real", "float16"),
        ("word", "int64"),  # str as a number
        ("small", "str"),  # a number as str
    ],
)
def test_narrowing_casts_are_refused_naming_column_and_dtypes(typed, key, wanted):
    with pytest.raises(DtypeError) as e:
        Tank(typed, {key: wanted}, 2)
    assert repr(key) in str(e.value) and wanted in str(e.value)


@pytest.mark.parametrize(
    ("key", "wanted"),
    [("small", "int32"), ("small", "float32"), ("real", "float64"), ("flag", "int8"),
     ("flag", "bool"), ("word", "str"), ("signed", "int64")],
)  # fmt: skip
def test_widening_casts_are_served(typed, key, wanted):
    batch = Tank(typed, {key: wanted}, 2, shuffle=False).next()
    if wanted != "str":
        assert batch[key].dtype == np.dtype(wanted)


def test_asked_for_narrowing_is_served_and_same_kind_checks_each_value(typed):
    tank = Tank(typed, {"small": "int8"}, 1, shuffle=False, cast="same_kind")
    assert tank.next()["small"].tolist() == [0]
    with pytest.raises(PackError, match=r"'small', row 1.*300.*int8"):
        tank.next()
    per_column = Tank(typed, {"small": "int8", "real": "float32"}, 6, shuffle=False,
                      cast={"small": "unsafe"})  # fmt: skip
    assert per_column.next()["small"][1] == np.int16(300).astype(np.int8)  # asked for: wraps
    signed = Tank(typed, {"signed": "int32"}, 2, shuffle=False, cast="same_kind")
    assert signed.next()["signed"].tolist() == [0, 1]
    with pytest.raises(PackError, match="does not fit int32"):
        signed.next()  # 2**40 in row 3
    with pytest.raises(ArgumentError, match="cast"):
        Tank(typed, {"small": "int8"}, 2, cast="sometimes")
    with pytest.raises(ArgumentError, match="cast"):
        Tank(typed, {"small": "int8"}, 2, cast={"nope": "unsafe"})


# --- 12: layouts and scales --------------------------------------------------------------


def test_images_come_nchw_and_scaled(pack):
    spec = {"image": "uint8", "label": "int64"}
    plain = Tank(pack, spec, 4, seed=1).next()["image"]
    nchw = Tank(pack, spec, 4, seed=1, layout="NCHW").next()["image"]
    assert nchw.shape == (4, 3, 8, 8) and nchw.dtype == np.uint8 and nchw.flags.c_contiguous
    np.testing.assert_array_equal(nchw, plain.transpose(0, 3, 1, 2))
    scaled = Tank(pack, spec, 4, seed=1, layout="NCHW", scale=1 / 255, workers=2).next()
    assert scaled["image"].dtype == np.float32 and scaled["label"].dtype == np.int64
    np.testing.assert_allclose(scaled["image"], plain.transpose(0, 3, 1, 2) / 255, rtol=1e-6)
    per_key = Tank(pack, spec, 4, seed=1, scale={"image": 2}).next()["image"]
    np.testing.assert_array_equal(per_key, plain.astype(np.float32) * 2)


def test_sequences_come_tchw(tmp_path):
    from PIL import Image

    for i in range(4):
        Image.fromarray(picture(i, 6, 6)).save(tmp_path / f"f{i}.png")
    write_csv(str(tmp_path / "list.csv"), [["clip", "label"], ["f0.png,f1.png", "0"],
                                           ["f2.png,f3.png", "1"]])  # fmt: skip
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"),
                        dtype=["vuint8", "int64"], is_seq=True)  # fmt: skip
    paths = gen.generate(str(tmp_path / "s.h5"), 6, 6, encode="PNG", workers=0).paths
    spec = {"clip": "uint8"}
    plain = Tank(paths, spec, 2, shuffle=False).next()["clip"]
    tchw = Tank(paths, spec, 2, shuffle=False, layout="NCHW", scale=0.5).next()["clip"]
    assert plain.shape == (2, 2, 6, 6, 3) and tchw.shape == (2, 2, 3, 6, 6)
    np.testing.assert_array_equal(tchw, plain.transpose(0, 1, 4, 2, 3) * np.float32(0.5))


def test_nchw_batches_feed_dock_conv_as_they_come(pack):
    torch = pytest.importorskip("torch")
    from dualtrain import Craft, dock
    from dualtrain_torch.craft import realize

    class Net(Craft):
        def __init__(self):
            super().__init__("NET")
            self.conv = dock.Conv(3, 5, kernel=3, padding="same")

        def run(self, x):
            return self.conv(x)

    tank = Tank(pack, {"image": "uint8"}, 4, to="torch", layout="NCHW", scale=1 / 255)
    out = realize(Net(), seed=0)(tank.next()["image"])
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (4, 5, 8, 8)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"layout": "CHW"}, "layout"),
        ({"scale": math.nan}, "scale"),
        ({"scale": math.inf}, "scale"),
        ({"scale": 0}, "scale"),
        ({"scale": True}, "scale"),
        ({"scale": {"label": 2.0}}, "scale"),
    ],
)
def test_bad_layouts_and_scales_are_named(pack, kwargs, says):
    with pytest.raises(ArgumentError, match=says):
        Tank(pack, {"image": "uint8", "label": "int64"}, 4, **kwargs)
    with pytest.raises(ArgumentError, match="scale"):
        Tank(pack, {"label": "int64"}, 4, scale=0.5)  # no image to scale


# --- 17: arguments and user functions --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"batch_size": True}, "batch_size"),
        ({"world": True}, "world"),
        ({"rank": True, "world": 2}, "rank"),
        ({"workers": True}, "workers"),
        ({"prefetch": False}, "prefetch"),
        ({"seed": True}, "seed"),
        ({"seed": 1.0}, "seed"),
        ({"seed": -1}, "seed"),  # not reduced modulo 2**64: -1 would be 2**64 - 1's order
        ({"seed": 2**64}, "seed"),
        ({"shuffle": "no"}, "shuffle"),
        ({"in_same_size": 0}, "in_same_size"),
        ({"drop_last": 1}, "drop_last"),
        ({"pad": 1}, "pad"),
        ({"batch_size": 2.0}, "batch_size"),
    ],
)
def test_bools_and_floats_are_not_ints_and_ints_are_not_bools(pack, kwargs, says):
    with pytest.raises(ArgumentError, match=says):
        Tank(pack, {"label": "int64"}, **{"batch_size": 4, **kwargs})


def test_numpy_ints_are_ints(pack):
    tank = Tank(pack, {"label": "int64"}, np.int64(4), seed=np.int32(3), world=np.int64(2))
    assert tank.batch_size == 4 and len(tank.next()["label"]) == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_a_prep_fn_returning_no_dict_is_named(pack, workers):
    def pair(sample):
        return sample["label"], sample["name"]

    tank = Tank(pack, {"label": "int64", "name": "str"}, 4, prep_fn=pair, workers=workers)
    with pytest.raises(ArgumentError, match="prep_fn returned a tuple"):
        tank.next()
    tank.close()
    fetch = Tank(pack, {"label": "int64"}, 4, fetch_fn=lambda data, i: [i])
    with pytest.raises(ArgumentError, match="fetch_fn returned a list"):
        fetch.next()
    # A prep_fn may make the dict from whatever fetch_fn gives.
    made = Tank(pack, {"label": "int64"}, 4, fetch_fn=lambda data, i: [i],
                prep_fn=lambda fetched: {"row": fetched[0]}, shuffle=False)  # fmt: skip
    assert made.next()["row"].tolist() == [0, 1, 2, 3]
    # With a collate_fn of one's own, samples may be anything.
    own = Tank(pack, {"label": "int64", "name": "str"}, 4, prep_fn=pair, collate_fn=len)
    assert own.next() == 4


def test_a_device_that_is_not_there_fails_at_construction(pack):
    torch = pytest.importorskip("torch")
    with pytest.raises(ArgumentError, match="device"):
        Tank(pack, {"label": "int64"}, 4, to="torch", device="gpu")
    with pytest.raises(ArgumentError, match="device"):
        Tank(pack, {"label": "int64"}, 4, to="torch", device="cuda:99")
    if not torch.cuda.is_available():
        with pytest.raises(ArgumentError, match="CUDA is not available"):
            Tank(pack, {"label": "int64"}, 4, to="torch", device="cuda")


# --- adversarial round 2: casts compare values, hints that work -------------------------

INTS = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"]
NUMBERS = [*INTS, "float16", "float32", "float64"]


def _extremes(dtype: str) -> list:
    """Each dtype's edge values: its own min and max, and the edges of narrower dtypes."""
    if dtype.startswith("float"):
        info = np.finfo(dtype)
        edges = [float(info.max), float(info.min), 0.5, -0.0, 70000.0, 1e-8, 2.0**24 + 1]
        return [v for v in edges if abs(v) <= float(info.max)]
    own = np.iinfo(dtype)
    edges = {int(own.min), int(own.max), 0, 1}
    for other in INTS:
        o = np.iinfo(other)
        edges |= {int(o.min), int(o.max), int(o.max) + 1, 2**53 + 1}
    return sorted(v for v in edges if own.min <= v <= own.max)


@pytest.fixture(scope="module")
def extremes(tmp_path_factory):
    """One column per numeric dtype, each row an edge value of that dtype (repeated last)."""
    folder = tmp_path_factory.mktemp("extremes")
    from PIL import Image

    Image.fromarray(picture(0, 4, 4)).save(os.path.join(folder, "0.png"))
    columns = {d: _extremes(d) for d in NUMBERS}
    n = max(len(v) for v in columns.values())
    rows = [["image", *NUMBERS]]
    rows += [["0.png", *(repr(columns[d][min(i, len(columns[d]) - 1)]) for d in NUMBERS)]
             for i in range(n)]  # fmt: skip
    write_csv(os.path.join(folder, "list.csv"), rows)
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"),
                        dtype=["vuint8", *NUMBERS])  # fmt: skip
    return gen.generate(str(folder / "x.h5"), 4, 4, encode="PNG", workers=0).paths, n


@settings(max_examples=60, deadline=None)
@given(stored=st.sampled_from(NUMBERS), wanted=st.sampled_from(NUMBERS),
       how=st.sampled_from(["safe", "same_kind"]))  # fmt: skip
def test_served_values_are_the_stored_ones_or_a_pack_error_naming_column_and_row(
    extremes, stored, wanted, how
):
    # uint8 200 as int8 is -56, which casts back to 200: a round-trip check let it through.
    paths, n = extremes
    try:
        tank = Tank(paths, {stored: wanted}, 1, shuffle=False, cast=how)
    except DtypeError:
        assert not np.can_cast(stored, wanted, how)
        return
    values = _extremes(stored)
    for row in range(n):
        want = values[min(row, len(values) - 1)]
        try:
            got = tank.next()[stored][0]
        except PackError as e:  # the row served next does not fit: named, and really lost
            assert f"{stored!r}, row {row}:" in str(e)
            kept = np.array(want, stored)
            if np.dtype(wanted).kind == "f":
                with np.errstate(over="ignore"):
                    lost = stored.startswith(("int", "uint")) or np.isinf(kept.astype(wanted))
                assert lost
            else:
                info = np.iinfo(wanted)
                assert not info.min <= int(kept) <= info.max
            return  # a Tank stops at a bad row: later rows are not served past it
        kept = np.array(want, stored)
        if stored.startswith("float"):
            # a float narrowing rounds, never overflows to inf
            assert got == kept.astype(wanted) and np.isfinite(got)
        else:  # integers exactly, compared as Python numbers (int == float is exact)
            assert got.item() == int(kept)


WRAPS = [("uint8", "int8"), ("uint32", "int32"), ("uint64", "int64"), ("int64", "float64")]


@pytest.mark.parametrize(("stored", "wanted"), WRAPS)
def test_same_kind_refuses_unsigned_wraparound_and_inexact_floats(extremes, stored, wanted):
    paths, n = extremes
    tank = Tank(paths, {stored: wanted}, n, shuffle=False, cast="same_kind")
    with pytest.raises(PackError, match=rf"'{stored}', row \d+: .*does not fit {wanted}"):
        tank.next()


REFUSED = [("int8", "uint8"), ("int64", "uint64"), ("int16", "int8"), ("float64", "float32")]


@pytest.mark.parametrize(("stored", "wanted"), REFUSED)
def test_a_refused_cast_suggests_what_works(extremes, stored, wanted):
    paths, _ = extremes
    with pytest.raises(DtypeError) as e:
        Tank(paths, {stored: wanted}, 1)
    match = __import__("re").search(r"cast=(\{.*?\})", str(e.value))
    assert match, str(e.value)
    Tank(paths, {stored: wanted}, 1, cast=eval(match.group(1)))  # the hint is accepted


def test_a_state_resumes_only_a_tank_with_the_same_shuffle_and_shard_order(pack):
    tank = Tank(pack, {"name": "str"}, 8, seed=5)
    tank.next()
    state = tank.state_dict()
    with pytest.raises(ArgumentError, match=r"state\['shuffle'\]"):
        Tank(pack, {"name": "str"}, 8, seed=5, shuffle=False).load_state_dict(state)
    with pytest.raises(ArgumentError, match=r"state\['files'\]"):
        Tank(pack[::-1], {"name": "str"}, 8, seed=5).load_state_dict(state)
    old = {k: v for k, v in state.items() if k not in ("shuffle", "files", "last")}
    resumed = Tank(pack, {"name": "str"}, 8, seed=5)
    resumed.load_state_dict(old)  # states written before these keys still load
    assert resumed.next()["name"] == tank.next()["name"]
    import json

    again = Tank(pack, {"name": "str"}, 8, seed=5)
    again.load_state_dict(json.loads(json.dumps(state)))  # through JSON: lists stay equal
    assert again.position == 1


def test_float64_under_jax_without_x64_is_refused_at_construction(typed):
    jax = pytest.importorskip("jax")
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on: float64 is served as it is")
    with pytest.raises(DtypeError, match=r"\['wide'\] as float64.*x64"):
        Tank(typed, {"wide": "float64"}, 2, to="jax")
    batch = Tank(typed, {"wide": "float32"}, 2, shuffle=False, to="jax", cast="same_kind").next()
    assert str(batch["wide"].dtype) == "float32"
