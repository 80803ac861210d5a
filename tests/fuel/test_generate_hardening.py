"""FuelGenerator against bad input: deep images, bad files, clashing names, paths leaving
file_dir, broken CSVs, bool/NaN arguments, run ids, stale temporary files, a full disk."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import tempfile
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from dualtrain import ArgumentError, PackError
from dualtrain.atomic import is_temp, temp_path
from dualtrain.fuel import FuelGenerator, Pack, Tank, decode
from dualtrain.fuel.images import encode, prepare
from tests.fuel.raw import (
    deep_picture,
    make_folder,
    picture,
    png16,
    save_deep,
    stored_meta,
    write_csv,
)
from tests.helpers import CHILD_TIMEOUT_S


def _one_column(folder, names, **kw) -> FuelGenerator:
    """A generator over `names` (image files in `folder`) with an int label per row."""
    rows = [["image", "label"], *([n, str(i)] for i, n in enumerate(names))]
    write_csv(str(folder / "list.csv"), rows)
    return FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"),
                         dtype=["int64"], **kw)  # fmt: skip


def _packs_left(folder) -> list[str]:
    return [f for f in os.listdir(folder) if f.endswith((".h5", ".npz")) or is_temp(f)]


# --- 6. bit depth: stored at the real depth, or refused; never clipped ---------------------

DEEP = [
    ("uint16", "png", "PNG"),
    ("uint16", "png", "RAW"),
    ("uint16", "tif", "PNG"),
    ("int32", "tif", "RAW"),
    ("float32", "tif", "RAW"),
]


@pytest.mark.parametrize(("depth", "ext", "enc"), DEEP)
@pytest.mark.parametrize("fmt", ["h5", "npz"])
def test_deep_images_are_stored_at_their_depth(tmp_path, depth, ext, enc, fmt):
    raws = [deep_picture(i, depth) for i in range(3)]
    for i, raw in enumerate(raws):
        save_deep(str(tmp_path / f"{i}.{ext}"), raw)
    gen = _one_column(tmp_path, [f"{i}.{ext}" for i in range(3)])
    report = gen.generate(str(tmp_path / f"p.{fmt}"), 12, 10, channel=1, encode=enc,
                          depth=depth, workers=0)  # fmt: skip
    pack = Pack(report.paths)
    assert pack.image["dtype"] == depth
    for i, raw in enumerate(raws):
        image = decode(pack["image"][i])
        assert image.dtype == np.dtype(depth) and image.shape == (12, 10, 1)
        np.testing.assert_array_equal(image[..., 0], raw)


def test_deep_images_resize_within_their_range(tmp_path):
    raw = np.tile(np.linspace(1000, 60000, 40), (30, 1)).astype(np.uint16)
    save_deep(str(tmp_path / "0.png"), raw)
    report = _one_column(tmp_path, ["0.png"]).generate(
        str(tmp_path / "p.h5"), 15, 20, channel=1, encode="PNG", depth="uint16", workers=0
    )
    image = decode(Pack(report.paths)["image"][0])[..., 0]
    assert image.dtype == np.uint16 and image.shape == (15, 20)
    assert 900 < image.min() < 2000 and 59000 < image.max() < 61000  # no clipping at 255


@pytest.mark.parametrize(("depth", "ext"), [("uint16", "png"), ("int32", "tif"),
                                            ("float32", "tif")])  # fmt: skip
def test_deep_images_are_refused_at_uint8_naming_file_and_line(tmp_path, depth, ext):
    Image.fromarray(picture(0)).save(tmp_path / "ok.png")
    save_deep(str(tmp_path / f"deep.{ext}"), deep_picture(1, depth))
    gen = _one_column(tmp_path, ["ok.png", f"deep.{ext}"])
    for channel in (1, 3):
        with pytest.raises(PackError) as e:
            gen.generate(str(tmp_path / "p.h5"), 8, 8, channel=channel, workers=0)
        message = str(e.value)
        assert "line 3" in message and f"deep.{ext}" in message
        assert f"depth={depth!r}" in message
    assert not _packs_left(tmp_path)
    report = gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0, on_error="skip")
    assert report.rows == 1 and [s.line for s in report.skipped] == [3]


@pytest.mark.parametrize("channels", [2, 3, 4])
def test_deep_colour_is_refused_at_every_depth(tmp_path, channels):
    arr = np.random.default_rng(0).integers(0, 65536, (6, 5, channels)).astype(np.uint16)
    (tmp_path / "c.png").write_bytes(png16(arr))
    gen = _one_column(tmp_path, ["c.png"])
    for depth, channel, enc in (("uint8", 3, "PNG"), ("uint16", 1, "RAW")):
        with pytest.raises(PackError, match=r"line 2.*c\.png.*more than 8 bits"):
            gen.generate(str(tmp_path / "p.h5"), 6, 5, channel=channel, encode=enc,
                         depth=depth, workers=0)  # fmt: skip


def test_unsigned_32_bit_tiffs_are_refused(tmp_path):
    buf = io.BytesIO()
    Image.fromarray(np.array([[1, -5]], np.int32)).save(buf, format="TIFF")
    signed = b"\x53\x01\x03\x00\x01\x00\x00\x00\x02\x00"  # SampleFormat = 2 (signed)
    assert buf.getvalue().count(signed) == 1
    unsigned = buf.getvalue().replace(signed, signed[:8] + b"\x01\x00")  # 4294967291 -> -5
    (tmp_path / "u.tif").write_bytes(unsigned)
    with pytest.raises(PackError, match=r"line 2.*u\.tif.*unsigned 32-bit"):
        _one_column(tmp_path, ["u.tif"]).generate(
            str(tmp_path / "p.h5"), 1, 2, channel=1, encode="RAW", depth="int32", workers=0
        )


def test_eight_bit_images_are_not_widened(tmp_path):
    Image.fromarray(picture(0)[..., 0]).save(tmp_path / "0.png")
    with pytest.raises(PackError, match=r"line 2.*uint8 samples.*'uint16'"):
        _one_column(tmp_path, ["0.png"]).generate(
            str(tmp_path / "p.h5"), 8, 8, channel=1, encode="PNG", depth="uint16", workers=0
        )


def test_uint8_raw_encoding_round_trips(tmp_path):
    Image.fromarray(picture(2)).save(tmp_path / "0.png")
    report = _one_column(tmp_path, ["0.png"]).generate(
        str(tmp_path / "p.npz"), 20, 24, encode="RAW", workers=0
    )
    np.testing.assert_array_equal(decode(Pack(report.paths)["image"][0]), picture(2))
    assert decode(Pack(report.paths)["image"][0], channel=1).shape == (20, 24, 1)


@settings(max_examples=20, deadline=None)
@given(
    arr=hnp.arrays(np.uint16, hnp.array_shapes(min_dims=2, max_dims=2, max_side=9)),
    enc=st.sampled_from(["PNG", "RAW"]),
)
def test_uint16_encodings_are_exact(arr, enc):
    """Law: a uint16 image stored as PNG or RAW decodes to the same values."""
    img, _ = prepare(png16(arr), arr.shape[0], arr.shape[1], 1, keep_exif=False,
                     depth="uint16")  # fmt: skip
    out = decode(encode(img, enc, 90))
    assert out.dtype == np.uint16
    np.testing.assert_array_equal(out[..., 0], arr)


def test_depth_arguments(tmp_path):
    save_deep(str(tmp_path / "0.png"), deep_picture(0, "uint16"))
    gen = _one_column(tmp_path, ["0.png"])
    dst = str(tmp_path / "p.h5")
    with pytest.raises(ArgumentError, match="depth must be"):
        gen.generate(dst, 8, 8, depth="uint12")
    with pytest.raises(ArgumentError, match="channel must be 1 for depth='uint16'"):
        gen.generate(dst, 8, 8, channel=3, encode="PNG", depth="uint16")
    with pytest.raises(ArgumentError, match="encode must be one of"):
        gen.generate(dst, 8, 8, channel=1, encode="JPEG", depth="uint16")
    with pytest.raises(ArgumentError, match="encode must be one of"):
        gen.generate(dst, 8, 8, channel=1, encode="PNG", depth="float32")
    assert not _packs_left(tmp_path)


# --- 7. every bad image is a PackError naming file and line, skippable ---------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares width x height (a decompression bomb's shape)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(b"\0" * 16)) + _chunk(b"IEND", b""))  # fmt: skip


def _png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(picture(5)).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg_bytes() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(picture(6)).save(buf, format="JPEG")
    return buf.getvalue()


BAD_FILES = {
    "empty.png": b"",
    "text.png": b"hello, not an image\n",
    "random.jpg": np.random.default_rng(0).bytes(300),
    "truncated.png": _png_bytes()[:-40],
    "truncated.jpg": _jpeg_bytes()[: len(_jpeg_bytes()) // 2],
    "bad_crc.png": _png_bytes()[:29] + b"\x00\x00\x00\x00" + _png_bytes()[33:],
    "header_only.png": _png_bytes()[:40],
    "bomb_warning.png": _png_claiming(10_000, 10_000),  # over Pillow's limit: a warning
    "bomb_error.png": _png_claiming(20_000, 20_000),  # over twice the limit: an error
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
@pytest.mark.parametrize("workers", [0, 2])
def test_bad_images_are_pack_errors_and_skippable(tmp_path, name, workers):
    Image.fromarray(picture(0)).save(tmp_path / "0.png")
    Image.fromarray(picture(1)).save(tmp_path / "1.png")
    (tmp_path / name).write_bytes(BAD_FILES[name])
    gen = _one_column(tmp_path, ["0.png", name, "1.png"])
    with pytest.raises(PackError) as e:
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=workers)
    assert "line 3" in str(e.value) and name in str(e.value) and "column 'image'" in str(e.value)
    assert e.value.__cause__ is not None  # Pillow's own error, kept
    assert not _packs_left(tmp_path)
    report = gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=workers, on_error="skip")
    assert report.rows == 2 and [(s.line, s.column) for s in report.skipped] == [(3, "image")]
    np.testing.assert_array_equal(Tank(report.paths, {"label": "int64"}, 2, shuffle=False)
                                  .next()["label"], [0, 2])  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["png", "jpeg", "tiff16"]),
    cut=st.floats(0, 1),
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), max_size=3),
)
def test_any_corruption_is_a_pack_error_or_a_packed_image(kind, cut, flips):
    """Law: a truncated or bit-flipped file is packed or is a PackError naming its line."""
    raw = {"png": _png_bytes(), "jpeg": _jpeg_bytes(), "tiff16": None}[kind]
    if raw is None:
        buf = io.BytesIO()
        Image.fromarray(deep_picture(0, "uint16")).save(buf, format="TIFF")
        raw = buf.getvalue()
    data = bytearray(raw[: max(1, int(len(raw) * cut))])
    for where, xor in flips:
        data[min(int(where * len(data)), len(data) - 1)] ^= xor
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "x.img").write_bytes(bytes(data))
        gen = _one_column(Path(folder), ["x.img"])
        depth, enc = ("uint16", "RAW") if kind == "tiff16" else ("uint8", "PNG")
        try:
            report = gen.generate(os.path.join(folder, "p.h5"), 8, 8, channel=1, encode=enc,
                                  depth=depth, workers=0)  # fmt: skip
        except PackError as e:
            assert "line 2" in str(e) and "x.img" in str(e)
            assert sorted(os.listdir(folder)) == ["list.csv", "x.img"]  # no pack left
        else:
            assert report.rows == 1
            assert decode(Pack(report.paths)["image"][0]).shape == (8, 8, 1)


def test_the_pixel_limit_is_settable_and_checked_before_decoding(tmp_path):
    Image.fromarray(picture(0)).save(tmp_path / "0.png")  # 24 x 20 = 480 pixels
    gen = _one_column(tmp_path, ["0.png"])
    with pytest.raises(PackError, match=r"line 2.*480 pixels, over max_image_pixels=479"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0, max_image_pixels=479)
    assert gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0, max_image_pixels=480).rows == 1
    # A bomb is refused even where warnings are not errors: by dualtrain's own check.
    (tmp_path / "bomb.png").write_bytes(_png_claiming(10_000, 10_000))
    gen = _one_column(tmp_path, ["bomb.png"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(PackError, match=r"line 2.*bomb\.png.*max_image_pixels=89478485"):
            gen.generate(str(tmp_path / "q.h5"), 8, 8, workers=0)
    for bad in (0, True, 1.5, float("inf"), 2**40):
        with pytest.raises(ArgumentError, match="max_image_pixels"):
            gen.generate(str(tmp_path / "q.h5"), 8, 8, max_image_pixels=bad)


# --- 8. packs are sets: run ids, two-step renames, clashing names, paths outside -----------


def test_shards_of_one_run_share_a_run_id(tmp_path):
    csv = make_folder(str(tmp_path / "raw"), 7)
    gen = FuelGenerator(file_dir=str(tmp_path / "raw"), file_list=csv,
                        dtype=["int64", "float32", "vint32", "str"])  # fmt: skip
    one = gen.generate(str(tmp_path / "a.h5"), 8, 8, shards=3, workers=0)
    two = gen.generate(str(tmp_path / "b.npz"), 8, 8, shards=3, workers=0)
    metas = [stored_meta(p) for p in one.paths]
    runs = {m["run"] for m in metas}
    assert len(runs) == 1 and len(next(iter(runs))) == 32 and int(next(iter(runs)), 16) >= 0
    assert [(m["shard"], m["shards"]) for m in metas] == [(0, 3), (1, 3), (2, 3)]
    for m in metas:  # the older keys stay
        assert {"image", "exif", "count", "keys", "columns", "format", "version"} <= set(m)
    assert stored_meta(two.paths[0])["run"] not in runs


def test_a_mix_of_two_runs_is_refused(tmp_path):
    csv = make_folder(str(tmp_path / "raw"), 6)
    gen = FuelGenerator(file_dir=str(tmp_path / "raw"), file_list=csv,
                        dtype=["int64", "float32", "vint32", "str"])  # fmt: skip
    dst = str(tmp_path / "p.h5")
    first = gen.generate(dst, 8, 8, shards=2, workers=0).paths
    old = Path(first[1]).read_bytes()
    gen.generate(dst, 8, 8, shards=2, workers=0)
    Path(first[1]).write_bytes(old)  # what a crash between the two renames would leave
    with pytest.raises(PackError, match="different generate runs"):
        Tank(first, {"label": "int64"}, 2)


@pytest.mark.parametrize("key", ["__fuel__", "image.offsets", "label.exif", "x.frames",
                                 "x.ends", "x.counts", "a/b", "."])  # fmt: skip
def test_column_names_that_clash_with_pack_datasets_are_refused(tmp_path, key):
    Image.fromarray(picture(0)).save(tmp_path / "0.png")
    write_csv(str(tmp_path / "list.csv"), [["image", "label", key], ["0.png", "1", "2"]])
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"),
                        dtype=["int64", "int64"])  # fmt: skip
    with pytest.raises(PackError, match=f"line 1: column {key!r}"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0)
    assert not _packs_left(tmp_path)


def test_column_names_of_numpy_savez_arguments_are_plain_columns(tmp_path):
    Image.fromarray(picture(0)).save(tmp_path / "0.png")
    write_csv(str(tmp_path / "list.csv"), [["image", "file", "allow_pickle"], ["0.png", "3", "4"]])
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"),
                        dtype=["int64", "int64"])  # fmt: skip
    report = gen.generate(str(tmp_path / "p.npz"), 8, 8, workers=0)
    row = Pack(report.paths).row(0)
    assert (row["file"], row["allow_pickle"]) == (3, 4)


def test_paths_outside_file_dir_are_refused_unless_allowed(tmp_path):
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    Image.fromarray(picture(0)).save(inside / "0.png")
    Image.fromarray(picture(1)).save(outside / "1.png")
    os.symlink(outside / "1.png", inside / "link.png")
    os.symlink(inside / "0.png", inside / "local.png")  # a link that stays inside is fine
    names = ["0.png", str(outside / "1.png"), "../out/1.png", "link.png", "local.png"]
    gen = _one_column(inside, names)
    with pytest.raises(PackError, match=r"line 3.*outside file_dir.*allow_outside=True"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0)
    report = gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0, on_error="skip")
    assert report.rows == 2 and [s.line for s in report.skipped] == [3, 4, 5]
    assert all("outside file_dir" in s.reason for s in report.skipped)
    gen.modify(allow_outside=True)
    assert gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0).rows == 5
    allowed = _one_column(inside, names, allow_outside=True)
    assert allowed.generate(str(tmp_path / "q.h5"), 8, 8, workers=0).rows == 5


# --- 17. CSV errors name the line; bools and NaN are not ints -------------------------------


def _csv_folder(tmp_path, text: bytes) -> FuelGenerator:
    for i in range(3):
        Image.fromarray(picture(i)).save(tmp_path / f"{i}.png")
    (tmp_path / "list.csv").write_bytes(text)
    return FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"),
                         dtype=["int64", "str"])  # fmt: skip


def test_bytes_that_are_not_utf8_name_the_line(tmp_path):
    gen = _csv_folder(tmp_path, b"image,label,name\n0.png,0,a\n1.png,1,caf\xe9\n2.png,2,c\n")
    with pytest.raises(PackError, match=r"line 3.*not UTF-8 text: byte 0xe9 in cell 3"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0)
    report = gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0, on_error="skip")
    assert report.rows == 2 and [s.line for s in report.skipped] == [3]
    gen = _csv_folder(tmp_path, b"image,lab\xffel,name\n0.png,0,a\n")
    with pytest.raises(PackError, match=r"line 1: the header is not UTF-8"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0, on_error="skip")


def test_an_over_long_field_names_the_line(tmp_path):
    long = b"x" * (200_000)
    gen = _csv_folder(tmp_path, b'image,label,name\n0.png,0,a\n1.png,1,"' + long + b'"\n')
    with pytest.raises(PackError, match=r"line 3: not a readable CSV record.*field larger"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0, on_error="skip")


def test_lines_are_physical_lines_and_a_bom_is_dropped(tmp_path):
    text = '\ufeffimage,label,name\n0.png,0,"two\nlines"\n1.png,x,b\n2.png,2,c\n'
    gen = _csv_folder(tmp_path, text.encode())
    with pytest.raises(PackError, match=r"line 4, column 'label'"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0)
    report = gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0, on_error="skip")
    assert [s.line for s in report.skipped] == [4]
    assert Pack(report.paths).row(0)["name"] == "two\nlines"


@pytest.mark.parametrize(
    ("name", "value"),
    [("shards", True), ("workers", True), ("height", True), ("width", False),
     ("channel", True), ("quality", True), ("keep_exif", 1), ("height", float("nan")),
     ("width", float("inf")), ("shards", 2.0), ("workers", float("nan"))],
)  # fmt: skip
def test_bools_and_non_finite_numbers_are_not_ints(tmp_path, name, value):
    Image.fromarray(picture(0)).save(tmp_path / "0.png")
    gen = _one_column(tmp_path, ["0.png"])
    args = {"dst_path": str(tmp_path / "p.h5"), "height": 8, "width": 8, name: value}
    with pytest.raises(ArgumentError, match=f"{name} must be"):
        gen.generate(**args)
    assert not _packs_left(tmp_path)


def test_generator_flags_are_checked(tmp_path):
    Image.fromarray(picture(0)).save(tmp_path / "0.png")
    gen = _one_column(tmp_path, ["0.png"])
    for key, value in (("is_seq", 1), ("allow_outside", "yes"), ("delimiter", ",;"),
                       ("quotechar", 0)):  # fmt: skip
        with pytest.raises(ArgumentError, match=f"{key} must be"):
            gen.modify(**{key: value})


# --- 5. temporary files: swept when their writer is gone; a full disk leaves none ----------


def test_the_next_generate_removes_temporary_files_of_dead_writers(tmp_path):
    Image.fromarray(picture(0)).save(tmp_path / "0.png")
    gen = _one_column(tmp_path, ["0.png"])
    out = tmp_path / "out"
    out.mkdir()
    code = "import sys; from dualtrain.atomic import temp_path; print(temp_path(sys.argv[1]))"
    dead = subprocess.run([sys.executable, "-c", code, str(out / "p.h5")], check=True,
                          capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S).stdout.strip()  # fmt: skip
    assert os.path.exists(dead) and is_temp(dead)
    live = temp_path(out / "other.h5")  # this process's own: still being written
    gen.generate(str(out / "p.h5"), 8, 8, workers=0)
    assert not os.path.exists(dead) and os.path.exists(live)
    assert sorted(os.listdir(out)) == sorted(["p.h5", os.path.basename(live)])


_FULL_DISK = """
import os, resource, signal, sys
from dualtrain.fuel import FuelGenerator
folder, dst = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
gen = FuelGenerator(file_dir=folder, file_list=folder + "/list.csv",
                    dtype=["int64", "float32", "vint32", "str"])
try:
    gen.generate(dst, 64, 64, encode="PNG", workers=0)
except OSError as e:
    print("errno", e.errno)
"""


@pytest.mark.parametrize("ext", ["h5", "npz"])
def test_a_full_disk_reports_the_disk_error_and_leaves_no_temporary_file(tmp_path, ext):
    make_folder(str(tmp_path / "raw"), 30, size=(64, 64))
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path / "raw"), str(out / f"p.{ext}")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["errno", "27"]  # EFBIG, the disk's own error
    assert os.listdir(out) == []


# --- adversarial round 2: deep modes, signed TIFFs, EXIF orientation ------------------------


@pytest.mark.parametrize(
    ("mode", "stored", "depth"),
    [
        ("I;16", "<u2", "uint16"),
        ("I;16L", "<u2", "uint16"),
        ("I;16B", ">u2", "uint16"),
        ("I", "<i4", "int32"),
        ("F", "<f4", "float32"),
    ],
)
def test_every_deep_mode_resizes_to_the_values_of_a_float_reference(mode, stored, depth):
    # Pillow resized I;16B as if it were native: byte-swapped garbage, not a resampled image.
    ramp = (np.add.outer(np.arange(6) * 700, np.arange(16) * 1000) + 300).astype(np.uint16)
    ref = np.asarray(
        Image.fromarray(ramp.astype(np.float32)).resize((8, 6), Image.Resampling.BICUBIC)
    )
    buf = io.BytesIO()
    Image.frombytes(mode, (16, 6), ramp.astype(stored).tobytes()).save(buf, format="TIFF")
    img, _ = prepare(buf.getvalue(), 6, 8, 1, keep_exif=False, depth=depth)
    got = np.asarray(img).astype(np.float64)
    assert got.shape == (6, 8)
    assert np.abs(got - ref).max() <= 0.5  # integer depths round; float32 is exact


def _signed8_tiff(path: Path, values: np.ndarray) -> None:
    """A one-strip grey TIFF of int8 samples (SampleFormat 2), which Pillow opens as "L"."""
    h, w = values.shape
    data = values.astype(np.int8).tobytes()
    entries = [(256, w), (257, h), (258, 8), (259, 1), (262, 1), (273, 8), (277, 1),
               (278, h), (279, len(data)), (339, 2)]  # fmt: skip
    ifd = struct.pack("<H", len(entries))
    for tag, val in entries:
        ifd += struct.pack("<HHI", tag, 4, 1) + struct.pack("<I", val)
    path.write_bytes(b"II*\x00" + struct.pack("<I", 8 + len(data)) + data + ifd + b"\0" * 4)


def test_signed_8_bit_tiffs_are_refused_naming_file_and_line(tmp_path):
    _signed8_tiff(tmp_path / "s.tif", np.full((4, 5), -5))
    with Image.open(tmp_path / "s.tif") as opened:
        assert opened.mode == "L"  # Pillow would read -5 as 251
    with pytest.raises(PackError, match=r"line 2.*s\.tif.*signed"):
        _one_column(tmp_path, ["s.tif"]).generate(str(tmp_path / "p.h5"), 4, 5, channel=1)
    Image.fromarray(picture(0, 4, 5)).save(tmp_path / "ok.png")
    report = _one_column(tmp_path, ["s.tif", "ok.png"]).generate(
        str(tmp_path / "p.h5"), 4, 5, on_error="skip"
    )
    assert report.rows == 1 and [s.line for s in report.skipped] == [2]


def test_kept_exif_says_upright_once_the_pixels_are_rotated(tmp_path):
    im = Image.fromarray(np.zeros((4, 8, 3), np.uint8))
    exif = im.getexif()
    exif[0x0112] = 6  # rotate 90: the pack stores the pixels rotated
    exif[0x010F] = "maker"
    im.save(tmp_path / "r.jpg", exif=exif.tobytes())
    report = _one_column(tmp_path, ["r.jpg"]).generate(str(tmp_path / "p.h5"), 8, 4)
    stored = Image.Exif()
    stored.load(bytes(Pack(report.paths)["image.exif"][0]))
    assert stored.get(0x0112) == 1 and stored.get(0x010F) == "maker"


@pytest.mark.parametrize("cell", ["0.png\x00", "0.png\x00x"])
def test_a_nul_byte_in_any_cell_is_a_skippable_pack_error_naming_the_line(tmp_path, cell):
    Image.fromarray(picture(0, 4, 4)).save(tmp_path / "0.png")
    csv_path = tmp_path / "list.csv"
    csv_path.write_bytes(f"image,name\n{cell},a\n0.png,b\x00c\n0.png,ok\n".encode())
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(csv_path), dtype=["str"])
    with pytest.raises(PackError, match=r"line 2, column 'image'.*NUL"):
        gen.generate(str(tmp_path / "p.h5"), 4, 4)
    report = gen.generate(str(tmp_path / "p.h5"), 4, 4, on_error="skip")
    assert report.rows == 1
    assert [(s.line, s.column) for s in report.skipped] == [(2, "image"), (3, "name")]


def test_a_fifo_or_a_symlink_loop_is_named_for_what_it_is(tmp_path):
    os.mkfifo(tmp_path / "fifo.png")
    os.symlink("loop2", tmp_path / "loop1")
    os.symlink("loop1", tmp_path / "loop2")
    os.mkdir(tmp_path / "dir.png")
    for name, said in [("fifo.png", "FIFO"), ("loop1", "loop of symbolic links"),
                       ("dir.png", "a folder"), ("none.png", "does not exist")]:  # fmt: skip
        with pytest.raises(PackError, match=rf"line 2.*{said}"):
            _one_column(tmp_path, [name]).generate(str(tmp_path / "p.h5"), 4, 4)


def test_a_blank_first_line_is_an_empty_header_on_line_1(tmp_path):
    (tmp_path / "list.csv").write_text("\nimage,label\n0.png,1\n")
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"),
                        dtype=["int64"])  # fmt: skip
    with pytest.raises(PackError, match="line 1: empty header"):
        gen.generate(str(tmp_path / "p.h5"), 4, 4)


@pytest.mark.parametrize(
    ("kw", "name"),
    [({"height": 2**31}, "height"), ({"width": 70000}, "width"),
     ({"channel": 4, "encode": "JPEG"}, "encode"), ({"channel": 4, "encode": "jpeg"}, "encode")],
)  # fmt: skip
def test_sizes_and_encodings_that_cannot_work_are_refused_at_the_call(tmp_path, kw, name):
    Image.fromarray(picture(0, 4, 4)).save(tmp_path / "0.png")
    args = {"height": 4, "width": 4, **kw}
    with pytest.raises(ArgumentError, match=rf"^{name} "):
        _one_column(tmp_path, ["0.png"]).generate(str(tmp_path / "p.h5"), **args)


@pytest.mark.parametrize("rows", [[], ["missing.png"]])
def test_no_empty_pack_is_written(tmp_path, rows):
    with pytest.raises(PackError, match=r"list\.csv.*no row to pack"):
        _one_column(tmp_path, rows).generate(str(tmp_path / "p.h5"), 4, 4, on_error="skip")
    assert _packs_left(tmp_path) == []


def test_a_tank_on_an_empty_pack_says_it_is_empty(tmp_path):
    from dualtrain.fuel.columns import ColumnType
    from dualtrain.fuel.writer import PackWriter

    columns = {"image": ColumnType.parse("vuint8"), "label": ColumnType.parse("int64")}
    meta = {"image": {"height": 4, "width": 4, "channel": 3, "encode": "PNG", "dtype": "uint8"}}
    writer = PackWriter(str(tmp_path / "e.h5"), columns, "image", is_seq=False,
                        keep_exif=False, meta=meta)  # fmt: skip
    writer.finish()
    writer.publish()
    with pytest.raises(PackError, match=r"empty \(0 rows\)"):
        Tank(str(tmp_path / "e.h5"), {"label": "int64"}, 2)
