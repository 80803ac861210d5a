"""Fuel refuses what it would otherwise serve wrong, silently (issue 27).

User callbacks' output is checked against what the next step reads; scales keep every pixel
finite and nonzero; CSV numbers follow one strict grammar; fixed-set options list their
values; epochs and sample keys stay within their 64-bit words; a dead worker process names
its rows; a tampered offset is caught when first read.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dualtrain import ArgumentError, PackError, ShapeError
from dualtrain.errors import DtypeError
from dualtrain.fuel import Comburant, Flip, FuelGenerator, SampleKey, Tank, TankWorkerError, decode
from dualtrain.fuel.columns import ColumnType, parse_cell
from dualtrain.fuel.finish import Finish
from dualtrain.fuel.pack import Pack
from tests.fuel.raw import DTYPES, make_folder, write_csv

N = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("silent")
    make_folder(str(path), N)
    return path


@pytest.fixture(scope="module")
def pack(folder):
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    return gen.generate(str(folder / "p.h5"), 12, 16, encode="PNG", workers=0).paths


# --- 1: what a callback returns is what the next step reads ---------------------------------


def chw(sample):
    return {**sample, "image": np.ascontiguousarray(sample["image"].transpose(2, 0, 1))}


def grayscale(sample):
    image = sample["image"].astype(np.float32) @ np.float32([0.299, 0.587, 0.114])
    return {**sample, "image": np.round(image).astype(np.uint8)[..., None]}


def two_channels(sample):
    return {**sample, "image": np.ascontiguousarray(sample["image"][..., :2])}


def float_jitter(sample):
    # A float augmentation before the scale: floats in [0, 255], not the pack's uint8.
    return {**sample, "image": np.clip(sample["image"] * np.float32(1.1), 0, 255)}


def huge(sample):
    return {**sample, "image": sample["image"].astype(np.float32) * np.float32(1e36)}


def wide_ints(sample):
    return {**sample, "image": sample["image"].astype(np.int64) << 40}


def raw_images(pack, prep, n=N):
    """What `prep` makes of the first `n` rows, in order, channel-last (by hand)."""
    served = Tank(pack, {"image": "uint8", "label": "int64"}, n, shuffle=False).next()
    return np.stack([prep({"image": image})["image"] for image in served["image"]])


@pytest.mark.parametrize("workers", [0, 2])
def test_layout_refuses_an_image_a_prep_fn_made_channel_first(pack, workers):
    tank = Tank(pack, {"image": "uint8"}, 4, layout="NCHW", prep_fn=chw, workers=workers)
    with pytest.raises(
        ShapeError, match=r"prep_fn returned shape \(3, 12, 16\) for row \d+, which looks "
        "channel-first already",
    ):  # fmt: skip
        tank.next()
    tank.close()


@pytest.mark.parametrize("prep", [grayscale, two_channels])
@pytest.mark.parametrize("workers", [0, 2])
def test_layout_transposes_an_image_whose_channels_a_prep_fn_changed(pack, prep, workers):
    tank = Tank(
        pack, {"image": "uint8"}, N, shuffle=False, layout="NCHW", prep_fn=prep, workers=workers
    )
    out = tank.next()["image"]
    tank.close()
    want = raw_images(pack, prep).transpose(0, 3, 1, 2)
    assert out.shape == want.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_scale_multiplies_the_floats_a_prep_fn_returns(pack, layout):
    tank = Tank(pack, {"image": "uint8"}, N, shuffle=False, layout=layout, scale=1 / 255,
                prep_fn=float_jitter)  # fmt: skip
    out = tank.next()["image"]
    want = raw_images(pack, float_jitter) / 255
    if layout == "NCHW":
        want = want.transpose(0, 3, 1, 2)
    assert out.dtype == np.float32 and out.min() >= 0 and out.max() <= 1
    np.testing.assert_allclose(out, want, rtol=1e-6)


@pytest.mark.parametrize("prep", [huge, wide_ints])
def test_scale_refuses_a_callback_pixel_it_would_make_inf(pack, prep):
    # 1 / 255 is a safe scale for uint8, not for what these prep_fns return.
    tank = Tank(pack, {"image": "uint8"}, N, shuffle=False, scale=1e30, prep_fn=prep)
    with pytest.raises(ArgumentError, match=r"scale=1e\+30 takes 'image''s pixel .* of row \d+ "
                       r"\(from prep_fn, (float32|int64)\) to np.float32\(inf\)"):  # fmt: skip
        tank.next()


def test_scale_refuses_a_nonzero_callback_pixel_it_would_make_zero(pack):
    def tiny(sample):
        return {**sample, "image": np.full((12, 16, 3), 1e-30, np.float32)}

    with pytest.raises(ArgumentError, match=r"takes 'image''s pixel .* to np.float32\(0.0\)"):
        Tank(pack, {"image": "uint8"}, 2, scale=1e-20, prep_fn=tiny).next()


def test_scale_refuses_a_callback_image_that_is_not_numbers(pack):
    def flags(sample):
        return {**sample, "image": sample["image"] > 100}

    with pytest.raises(DtypeError, match=r"prep_fn returned bool for row \d+"):
        Tank(pack, {"image": "uint8"}, 2, scale=1 / 255, prep_fn=flags).next()


def test_layout_names_fetch_fn_when_it_makes_the_sample(pack):
    def fetch(data, index):
        return {"image": np.ascontiguousarray(data["image"][index].transpose(2, 0, 1))}

    with pytest.raises(ShapeError, match=r"fetch_fn returned shape \(3, 12, 16\) for row"):
        Tank(pack, {"image": "uint8"}, 4, layout="NCHW", fetch_fn=fetch).next()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5)), data=st.data())
def test_layout_refuses_exactly_the_channel_first_shapes(pack, shape, data):
    # The law: (H, W, C') is refused iff C' is not the pack's 3 and H is; else it is moved.
    tank = Tank(pack, {"image": "uint8"}, 1, layout="NCHW")
    finish = Finish(tank.pack, tank.spec, "NCHW", None)
    dtype = data.draw(st.sampled_from([np.uint8, np.float32, np.int64]))
    image = np.arange(math.prod(shape)).reshape(shape).astype(dtype)
    if shape[2] != 3 and shape[0] == 3:
        with pytest.raises(ShapeError, match=r"returned shape .* for row 5, which looks channel"):
            finish({"image": image}, "prep_fn", 5)
    else:
        out = finish({"image": image}, "prep_fn", 5)["image"]
        assert out.dtype == image.dtype
        np.testing.assert_array_equal(out, image.transpose(2, 0, 1))


def test_layout_keeps_its_rank_check(pack):
    def flat(sample):
        return {**sample, "image": sample["image"][..., 0]}

    with pytest.raises(ShapeError, match=r"prep_fn returned a ndarray of shape \(12, 16\)"):
        Tank(pack, {"image": "uint8"}, 4, layout="NCHW", prep_fn=flat).next()


def ragged_label(sample):
    # A label that is an int64 array in most rows and a float (another dtype) in row 3.
    return {**sample, "label": 1.5 if int(sample["label"]) == 3 else sample["label"]}


def ragged_image(sample):
    image = sample["image"]
    return {**sample, "image": image[:-1] if int(sample["label"]) == 2 else image}


@pytest.mark.parametrize("prep", [ragged_label, ragged_image])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_fixed_column_of_another_shape_in_one_row_is_named(pack, prep, workers):
    tank = Tank(
        pack, {"image": "uint8", "label": "int64"}, N, shuffle=False, prep_fn=prep,
        workers=workers,
    )  # fmt: skip
    with pytest.raises(ShapeError, match=r"prep_fn returned .* of row \d+; row \d+ returned"):
        tank.next()
    tank.close()


def crop(sample):
    return {**sample, "image": sample["image"][2:10, 3:11]}


def as_floats(sample):
    return {**sample, "image": sample["image"].astype(np.float32) / 2}


@pytest.mark.parametrize("prep", [crop, as_floats, grayscale])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_fixed_column_every_row_changes_alike_is_stacked(pack, prep, workers):
    tank = Tank(pack, {"image": "uint8"}, N, shuffle=False, prep_fn=prep, workers=workers)
    out = tank.next()["image"]
    tank.close()
    want = raw_images(pack, prep)
    assert isinstance(out, np.ndarray) and out.dtype == want.dtype
    np.testing.assert_array_equal(out, want)


def label_names(sample):
    return {**sample, "label": f"class {int(sample['label'])}"}


def test_variable_columns_and_values_of_one_other_kind_still_become_lists(pack):
    batch = Tank(pack, {"image": "uint8", "tags": "vint32"}, N, shuffle=False).next()
    assert isinstance(batch["tags"], list) and batch["image"].shape == (N, 12, 16, 3)
    named = Tank(pack, {"label": "int64"}, N, shuffle=False, prep_fn=label_names).next()
    assert named["label"][:2] == ["class 0", "class 1"]


# --- 2: scales keep every pixel finite and nonzero ------------------------------------------


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    scale=st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != 0)
    | st.sampled_from([1e40, -1e40, 1e-50, 1e-39, 1.3e36, 1.4e36, 1 / 255])
)
def test_a_scale_serves_finite_nonzero_pixels_or_is_refused(pack, scale):
    try:
        tank = Tank(pack, {"image": "uint8"}, 2, shuffle=False, scale=scale)
    except ArgumentError as e:
        assert "scale" in str(e) and repr(scale) in str(e)
        with np.errstate(over="ignore", under="ignore"):
            narrow = abs(float(np.float32(scale)))  # what the pixels are multiplied by
        largest, tiny = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)
        assert narrow * 255 > largest or narrow < tiny
        return
    raw = Tank(pack, {"image": "uint8"}, 2, shuffle=False).next()["image"]
    out = tank.next()["image"]
    assert np.isfinite(out).all()
    assert ((out != 0) == (raw != 0)).all()


def test_a_float_pack_checks_each_scaled_pixel(tmp_path):
    from tests.fuel.raw import save_deep

    arr = np.full((6, 6), 3e30, np.float32)
    save_deep(str(tmp_path / "0.tif"), arr)
    write_csv(str(tmp_path / "l.csv"), [["image", "label"], ["0.tif", "1"]])
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "l.csv"),
                        dtype=["vuint8", "int64"])  # fmt: skip
    paths = gen.generate(str(tmp_path / "f.h5"), 6, 6, channel=1, encode="RAW", depth="float32",
                         workers=0).paths  # fmt: skip
    assert np.isfinite(Tank(paths, {"image": "float32"}, 1, scale=1e8).next()["image"]).all()
    with pytest.raises(ArgumentError, match=r"scale=10000000000.0 takes 'image'"):
        Tank(paths, {"image": "float32"}, 1, scale=1e10).next()


# --- 3: CSV numbers follow one strict grammar -----------------------------------------------

DIGITS = "0123456789"


def reference_int(text: str) -> bool:
    """The grammar of an integer cell, by hand: an optional sign, then ASCII digits."""
    body = text[1:] if text[:1] in ("+", "-") else text
    return body != "" and all(c in DIGITS for c in body)


def reference_float(text: str) -> bool:
    """The grammar of a float cell, by hand: sign, digits with one point, optional exponent."""
    body = text[1:] if text[:1] in ("+", "-") else text
    mantissa, _, exponent = body.partition("e") if "e" in body else body.partition("E")
    if ("e" in body or "E" in body) and not reference_int(exponent):
        return False
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    return digits != "" and all(c in DIGITS for c in digits)


cells = st.text(alphabet="0123456789+-.eE_ \u0661\u0662\u00a0xnaif", max_size=8) | st.sampled_from(
    ["1e400", "-1e400", "1_000", "\u0661\u0662\u0663", "nan", "inf", "1e-50", "65520", "1e5"]
)


@settings(max_examples=400)
@given(
    text=cells, base=st.sampled_from(["int8", "uint8", "int64", "float16", "float32", "float64"])
)
def test_numeric_cells_parse_exactly_by_the_strict_grammar(text, base):
    ctype = ColumnType.parse(base)
    part = text.strip(" \t")
    if "," in text or part == "":
        return
    if base.startswith(("int", "uint")):
        info = np.iinfo(base)
        accept = reference_int(part) and info.min <= int(part) <= info.max
    else:
        value = float(part) if reference_float(part) else math.nan
        # A float may round (1e-50 as float32 is 0), as a same_kind cast may, but not overflow.
        accept = math.isfinite(value) and abs(value) <= float(np.finfo(base).max)
    if accept:
        want = int(part) if base.startswith(("int", "uint")) else float(part)
        assert parse_cell(text, ctype) == np.asarray(want, base)
    else:
        with pytest.raises(DtypeError, match=re.escape(repr(part))):
            parse_cell(text, ctype)


@pytest.mark.parametrize(
    ("cell", "dtype"),
    [("1e400", "float32"), ("1_000", "int64"), ("\u0661\u0662\u0663", "int64"), ("nan", "float64"),
     ("inf", "float32"), ("1e39", "float32"), ("1_0.5", "float32"), ("\u00a05", "int32")],
)  # fmt: skip
def test_generate_names_file_line_column_and_cell(folder, tmp_path, cell, dtype):
    listing = write_csv(str(tmp_path / "c.csv"), [["image", "label"], ["0.png", "1"],
                                                  ["1.png", cell]])  # fmt: skip
    gen = FuelGenerator(file_dir=str(folder), file_list=listing, dtype=["vuint8", dtype])
    with pytest.raises(PackError) as caught:
        gen.generate(str(tmp_path / "c.h5"), 12, 16, workers=0)
    message = str(caught.value)
    assert "c.csv" in message and "line 3" in message and "'label'" in message
    assert repr(cell) in message


# --- 4: options of a fixed set list their values --------------------------------------------


@pytest.mark.parametrize("channel", [2, 0, 5, True, 3.0, "3"])
def test_decode_lists_the_channels_it_takes(pack, channel):
    cell = Pack(pack)["image"][0]
    with pytest.raises(ArgumentError, match=r"channel must be None or one of \[1, 3, 4\]"):
        decode(cell, channel=channel)
    with pytest.raises(ArgumentError, match="channel"):
        decode(np.zeros((4, 4, 3), np.uint8), channel=channel)


def test_decode_takes_numpy_channels(pack):
    cell = Pack(pack)["image"][0]
    assert decode(cell, channel=np.int64(1)).shape == (12, 16, 1)


# --- 5: epochs and sample keys within their words -------------------------------------------


@pytest.mark.parametrize("epoch", [2**64, 2**63, -1, True, np.True_, 1.0])
def test_a_state_with_an_epoch_out_of_range_is_refused_first(pack, epoch):
    tank = Tank(pack, {"label": "int64"}, 2)
    state = {**tank.state_dict(), "epoch": epoch}
    with pytest.raises(ArgumentError, match=r"state\['epoch'\] must be an int in \[0, 2\*\*63\)"):
        tank.load_state_dict(state)
    assert tank.epoch == 0 and tank.next()["label"].shape == (2,)


def test_a_state_with_a_large_numpy_epoch_resumes(pack):
    tank = Tank(pack, {"label": "int64"}, 2)
    tank.load_state_dict({**tank.state_dict(), "epoch": np.uint64(2**63 - 1)})
    assert tank.next()["label"].shape == (2,)


@pytest.mark.parametrize(
    "key",
    [(0, 2**64, 0), (0, 0, 2**63), (2**64, 0, 0), SampleKey(0, 2**63, 0), (0, -1, 0),
     SampleKey(0, 0, -1), (0, np.uint64(2**64 - 1), 0)],
)  # fmt: skip
def test_a_sample_key_out_of_its_words_is_refused(key):
    with pytest.raises(
        ArgumentError, match=r"key must be \(seed, epoch, index\): a seed in \[0, 2\*\*64\)"
    ):
        Comburant(Flip())(np.zeros((4, 4, 3), np.uint8), key=key)


def test_the_largest_sample_key_draws():
    image = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    key = (2**64 - 1, 2**63 - 1, np.uint64(2**63 - 1))
    assert Comburant(Flip())(image, key=key).shape == (4, 4, 3)


# --- 6: a dead worker process names its rows ------------------------------------------------


def die_on_row_three(sample):  # module level: spawned workers unpickle it
    if int(sample["label"]) == 3:
        os._exit(13)
    return sample


def test_a_dead_worker_process_names_the_rows_in_flight(pack):
    tank = Tank(
        pack, {"label": "int64"}, N, shuffle=False, prep_fn=die_on_row_three, workers=1,
        worker_mode="process", prefetch=0,
    )  # fmt: skip
    with pytest.raises(TankWorkerError, match=r"batch 0 of epoch 0 \(rows \[0, 1, 2, 3") as caught:
        tank.next()
    assert caught.value.rows == list(range(N)) and caught.value.epoch == 0
    assert isinstance(caught.value, RuntimeError)
    tank.close()


# --- 7: offsets are checked, and checksummed -------------------------------------------------


def _rewrite(path, name, change):
    import h5py

    with h5py.File(path, "r+") as f:
        data = f[name][()]
        f[name][...] = change(data)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_tampered_offset_is_detected(pack, tmp_path_factory, data):
    name = data.draw(st.sampled_from(["image.offsets", "tags.offsets", "name.offsets"]))
    copy = str(tmp_path_factory.mktemp("tamper") / "p.h5")
    shutil.copy(pack[0], copy)
    count = len(Pack([copy]))
    index = data.draw(st.integers(0, count))
    delta = data.draw(st.integers(-5, 5).filter(lambda d: d != 0))

    def change(offsets):
        offsets = offsets.copy()
        offsets[index] += delta
        return offsets

    _rewrite(copy, name, change)
    tampered = Pack([copy])  # opening reads no offsets
    with pytest.raises(PackError, match=re.escape(name)):
        for i in range(count):
            tampered[name.split(".")[0]][i]


def test_packs_without_checksums_still_read(pack, tmp_path):
    import h5py

    copy = str(tmp_path / "old.h5")
    shutil.copy(pack[0], copy)
    with h5py.File(copy, "r+") as f:
        meta = json.loads(f.attrs["__fuel__"])
        del meta["checksums"]
        f.attrs["__fuel__"] = json.dumps(meta)
    old, new = Pack([copy]), Pack(pack)
    for i in range(N):
        assert old["name"][i] == new["name"][i]
        np.testing.assert_array_equal(old["image"][i], new["image"][i])


def test_written_checksums_are_in_the_metadata(pack):
    from tests.fuel.raw import stored_meta

    sums = stored_meta(pack[0])["checksums"]
    assert set(sums) == {"image.offsets", "image.exif.offsets", "tags.offsets", "name.offsets"}


def test_malformed_checksums_are_a_pack_error(pack, tmp_path):
    import h5py

    copy = str(tmp_path / "bad.h5")
    shutil.copy(pack[0], copy)
    with h5py.File(copy, "r+") as f:
        meta = json.loads(f.attrs["__fuel__"])
        meta["checksums"] = {"image.offsets": -1}
        f.attrs["__fuel__"] = json.dumps(meta)
    with pytest.raises(PackError, match="checksums"):
        Pack([copy])


def test_an_offsets_array_that_ends_short_of_its_values_is_refused(pack, tmp_path):
    # Ending one entry early leaves rising offsets within the values: only an exact end,
    # or the checksum, tells.
    import h5py

    copy = str(tmp_path / "short.h5")
    shutil.copy(pack[0], copy)
    with h5py.File(copy, "r+") as f:
        meta = json.loads(f.attrs["__fuel__"])
        del meta["checksums"]
        f.attrs["__fuel__"] = json.dumps(meta)
    _rewrite(copy, "name.offsets", lambda o: np.concatenate([o[:-1], [o[-1] - 1]]))
    with pytest.raises(PackError, match=r"name\.offsets"):
        Pack([copy])["name"][N - 1]
