"""FuelGenerator: round trips through the pack, shards, sequences, EXIF, and bad rows."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import assume, example, given, settings, strategies as st
from PIL import Image

from dualtrain import ArgumentError, PackError
from dualtrain.atomic import is_temp
from dualtrain.fuel import FuelGenerator, Pack, Tank, decode
from tests.fuel.raw import (
    DTYPES,
    SPEC,
    expected_row,
    make_folder,
    picture,
    stored_meta,
    write_csv,
)

N = 11


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("raw")
    make_folder(str(path), N)
    return str(path)


def generator(folder: str, **kw) -> FuelGenerator:
    return FuelGenerator(file_dir=folder, file_list=os.path.join(folder, "list.csv"),
                         dtype=DTYPES, **kw)  # fmt: skip


@settings(max_examples=8)
@given(ext=st.sampled_from(["h5", "hdf5", "npz"]), shards=st.integers(1, 4))
def test_png_round_trip_is_exact_with_labels(folder, tmp_path_factory, ext, shards):
    out = tmp_path_factory.mktemp("pack")
    report = generator(folder).generate(str(out / f"p.{ext}"), 20, 24, encode="PNG",
                                        shards=shards, workers=0)  # fmt: skip
    assert report.rows == N and len(report.paths) == shards and not report.skipped
    assert sorted(os.listdir(out)) == sorted(os.path.basename(p) for p in report.paths)
    sizes = [stored_meta(p)["count"] for p in report.paths]
    assert sum(sizes) == N and max(sizes) - min(sizes) <= 1  # near-equal shards
    tank = Tank(report.paths, SPEC, N, shuffle=False, in_same_size=False)
    batch = tank.next()
    for i in range(N):
        np.testing.assert_array_equal(batch["image"][i], picture(i))
        want = expected_row(i)
        assert batch["label"][i] == want["label"] and batch["name"][i] == want["name"]
        np.testing.assert_array_equal(batch["box"][i], want["box"])
        np.testing.assert_array_equal(batch["tags"][i], want["tags"])
        assert batch["tags"][i].dtype == np.int32


def test_jpeg_round_trip_within_codec_tolerance(folder, tmp_path):
    report = generator(folder).generate(str(tmp_path / "p.h5"), 20, 24, quality=95, workers=0)
    pack = Pack(report.paths)
    for i in range(N):
        image = decode(pack["image"][i])
        # Exactly Pillow's own JPEG round trip at that quality, and close to the original.
        buf = io.BytesIO()
        Image.fromarray(picture(i)).save(buf, format="JPEG", quality=95)
        np.testing.assert_array_equal(image, decode(buf.getvalue()))
        assert np.abs(image.astype(int) - picture(i)).mean() < 16  # colour noise, 4:2:0


def test_worker_processes_write_the_same_pack(folder, tmp_path):
    one = generator(folder).generate(str(tmp_path / "a.npz"), 10, 12, encode="PNG", workers=0)
    two = generator(folder).generate(str(tmp_path / "b.npz"), 10, 12, encode="PNG", workers=2)
    a, b = np.load(one.paths[0]), np.load(two.paths[0])
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
        if name != "__fuel__":
            np.testing.assert_array_equal(a[name], b[name])
    meta_a, meta_b = stored_meta(one.paths[0]), stored_meta(two.paths[0])
    assert meta_a.pop("run") != meta_b.pop("run")  # one run id per generate
    assert meta_a == meta_b


def test_resize_and_channel_conversion(folder, tmp_path):
    for channel in (1, 3, 4):
        report = generator(folder).generate(
            str(tmp_path / f"c{channel}.h5"), 7, 9, channel=channel, encode="PNG", workers=0
        )
        image = decode(Pack(report.paths)["image"][0])
        assert image.shape == (7, 9, channel)
    grey = Pack(str(tmp_path / "c1.h5"))
    want = np.asarray(Image.fromarray(picture(0)).convert("L").resize((9, 7), Image.BICUBIC))
    np.testing.assert_array_equal(decode(grey["image"][0])[..., 0], want)


def test_exif_orientation_is_applied_and_the_block_kept(tmp_path):
    raw = picture(3, 10, 16)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    Image.fromarray(raw).save(tmp_path / "r.png", exif=exif.tobytes())
    write_csv(str(tmp_path / "list.csv"), [["image", "label"], ["r.png", "1"]])
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"),
                        dtype=["int64"])  # fmt: skip
    report = gen.generate(str(tmp_path / "p.h5"), 16, 10, encode="PNG", workers=0)
    pack = Pack(report.paths)
    np.testing.assert_array_equal(decode(pack["image"][0]), np.rot90(raw, k=-1))
    kept = Image.Exif()
    kept.load(pack["image.exif"][0].tobytes())
    assert kept[0x0112] == 1  # the pixels are stored upright: the kept block says so
    report = gen.generate(str(tmp_path / "q.h5"), 16, 10, encode="PNG", keep_exif=False,
                          workers=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"image\.exif"):
        Pack(report.paths)["image.exif"]


def test_sequences_store_every_frame(tmp_path):
    for i in range(6):
        Image.fromarray(picture(i, 8, 8)).save(tmp_path / f"f{i}.png")
    rows = [["clip", "label"], ["f0.png,f1.png,f2.png", "0"], ["f3.png", "1"],
            ["f4.png,f5.png", "2"]]  # fmt: skip
    write_csv(str(tmp_path / "list.csv"), rows)
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"),
                        dtype=["vuint8", "int64"], is_seq=True)  # fmt: skip
    for ext in ("h5", "npz"):
        report = gen.generate(str(tmp_path / f"s.{ext}"), 8, 8, encode="PNG", workers=0)
        clips = Pack(report.paths)["clip"]
        assert [len(clips[i]) for i in range(3)] == [3, 1, 2]
        tank = Tank(report.paths, {"clip": "uint8", "label": "int64"}, 3, shuffle=False)
        batch = tank.next()
        assert batch["clip"][0].shape == (3, 8, 8, 3)  # frame counts differ: a list
        np.testing.assert_array_equal(batch["clip"][2][1], picture(5, 8, 8))
        np.testing.assert_array_equal(batch["label"], [0, 1, 2])


def _bad_folder(tmp_path, rows):
    for i in range(3):
        Image.fromarray(picture(i)).save(tmp_path / f"{i}.png")
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    write_csv(str(tmp_path / "list.csv"), [["image", "label", "box"], *rows])
    return FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"),
                         dtype=["vuint8", "uint8", "float32"])  # fmt: skip


@pytest.mark.parametrize(
    ("row", "column", "says"),
    [
        (["missing.png", "1", "0"], "image", "does not exist"),
        (["broken.jpg", "1", "0"], "image", "cannot read image"),
        (["1.png", "300", "0"], "label", "does not fit uint8"),
        (["1.png", "x", "0"], "label", "not an integer"),
        (["1.png", "1", "1,2"], "box", "a 'v' type"),
        (["1.png", "1"], "box", "has 2 cells"),
        (["1.png", "1", "1e300"], "box", "does not fit float32"),
    ],
)
def test_bad_rows_name_file_line_and_column(tmp_path, row, column, says):
    gen = _bad_folder(tmp_path, [["0.png", "0", "0.5"], row, ["2.png", "2", "1"]])
    with pytest.raises(PackError) as e:
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0)
    message = str(e.value)
    assert "list.csv" in message and "line 3" in message and f"column {column!r}" in message
    assert says in message
    assert not [f for f in os.listdir(tmp_path) if f.startswith(("p.", ".p."))]  # no pack left
    report = gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=0, on_error="skip")
    assert report.rows == 2 and [(s.line, s.column) for s in report.skipped] == [(3, column)]
    assert says in report.skipped[0].reason
    tank = Tank(report.paths, {"label": "uint8"}, 2, shuffle=False)
    np.testing.assert_array_equal(tank.next()["label"], [0, 2])


def test_bad_arguments(folder, tmp_path):
    gen = generator(folder)
    with pytest.raises(ArgumentError, match="dst_path"):
        gen.generate(str(tmp_path / "p.tar"), 8, 8)
    with pytest.raises(ArgumentError, match="dst_path"):
        gen.generate(str(tmp_path / "no" / "such" / "p.h5"), 8, 8)
    with pytest.raises(ArgumentError, match="height must be a positive int; got height=0"):
        gen.generate(str(tmp_path / "p.h5"), 0, 8)
    with pytest.raises(ArgumentError, match="channel"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, channel=2)
    with pytest.raises(ArgumentError, match="workers must be"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, workers=-1)
    with pytest.raises(ArgumentError, match="encode"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, encode="GIF")
    with pytest.raises(ArgumentError, match="shards"):
        gen.generate(str(tmp_path / "p.h5"), 8, 8, shards=N + 1)
    with pytest.raises(ArgumentError, match="dtype"):
        FuelGenerator(file_dir=folder, file_list=os.path.join(folder, "list.csv"),
                      dtype=["int64", "int65", "float32", "vint32", "str"])  # fmt: skip
    with pytest.raises(ArgumentError, match="dtype"):
        FuelGenerator(
            file_dir=folder, file_list=os.path.join(folder, "list.csv"), dtype=["vuint8", "int64"]
        ).generate(str(tmp_path / "p.h5"), 8, 8)
    with pytest.raises(ArgumentError, match="mutually exclusive"):
        FuelGenerator({"file_dir": folder}, file_dir=folder)
    with pytest.raises(ArgumentError, match="config"):
        gen.modify(hieght=200)  # a misspelt key (height itself is a setting since issue 18)
    assert not os.listdir(tmp_path)


def test_unwritable_destination_fails_before_any_work(folder, tmp_path):
    # /proc takes no new files, even from root; a read-only folder stops other users.
    with pytest.raises(OSError, match=r"dst_path '/proc/p\.h5' cannot be written"):
        generator(folder).generate("/proc/p.h5", 8, 8, workers=0)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):
            with pytest.raises(OSError, match="cannot be written"):
                generator(folder).generate(str(locked / "p.npz"), 8, 8, workers=0)
    finally:
        locked.chmod(0o700)


def test_config_and_modify(folder, tmp_path):
    gen = FuelGenerator({"file_dir": folder, "file_list": os.path.join(folder, "list.csv"),
                         "dtype": DTYPES})  # fmt: skip
    gen.modify(dtype={"label": "int16", "box": "float64", "tags": "vint64", "name": "str"})
    report = gen.generate(str(tmp_path / "p.npz"), 8, 8, workers=0)
    assert Pack(report.paths).columns["box"]["type"] == "float64"
    assert gen.config["dtype"]["label"] == "int16"


_KILLED = """
import sys
from dualtrain.fuel import FuelGenerator
gen = FuelGenerator(file_dir=sys.argv[1], file_list=sys.argv[1] + "/list.csv",
                    dtype=["vuint8", "int64", "float32", "vint32", "str"])
gen.generate(sys.argv[2], 64, 64, encode="PNG", workers=0)
"""


@pytest.mark.slow
def test_a_killed_generate_leaves_no_pack_under_the_final_name(tmp_path):
    folder = tmp_path / "raw"
    make_folder(str(folder), 400, size=(96, 96))
    dst = tmp_path / "out" / "p.h5"
    dst.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(folder), str(dst)])
    deadline = time.monotonic() + 60
    while not [f for f in os.listdir(dst.parent) if is_temp(f)]:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    time.sleep(0.3)  # well inside the run, some rows written
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not dst.exists()
    assert all(is_temp(f) for f in os.listdir(dst.parent))


def test_images_are_stored_reencoded(folder, tmp_path):
    report = generator(folder).generate(str(tmp_path / "p.h5"), 20, 24, workers=0)
    stored = Pack(report.paths)["image"][0].tobytes()
    assert Image.open(io.BytesIO(stored)).format == "JPEG"


# One source file: (format, mode, size fits, EXIF: none / upright / rotated, truncated).
_source_files = st.tuples(
    st.sampled_from(["JPEG", "PNG"]),
    st.sampled_from(["RGB", "L", "RGBA", "P"]),
    st.booleans(),
    st.sampled_from([None, 1, 6]),
    st.booleans(),
)


@settings(max_examples=40, deadline=None)
@given(
    files=st.lists(_source_files, min_size=1, max_size=6),
    encode=st.sampled_from(["JPEG", "PNG"]),
    keep_exif=st.booleans(),
)
# An upright EXIF block not kept: re-encoded (it would stay in the stored file otherwise).
@example(files=[("JPEG", "RGB", True, 1, False)], encode="JPEG", keep_exif=False)
@example(files=[("PNG", "RGB", True, 1, False)], encode="PNG", keep_exif=True)
def test_reencode_false_packs_a_fitting_file_as_it_is_and_the_others_as_before(
    tmp_path_factory, files, encode, keep_exif
):
    """Law: with reencode=False each row is stored either as the source file's own bytes
    (a file of the pack's format, size and mode, upright, complete, EXIF only when kept),
    which decode to what Pillow decodes from the file, or exactly as reencode=True stores
    it; bad files are bad rows either way."""
    assume(not all(f[4] for f in files))  # a pack of no rows is an error of its own
    folder = tmp_path_factory.mktemp("src")
    rows, sources, fitting = [["image", "label"]], [], []
    for i, (fmt, mode, fits, orientation, truncated) in enumerate(files):
        if fmt == "JPEG" and mode in ("RGBA", "P"):
            mode = "RGB"  # JPEG holds neither
        size = (24, 20) if fits else (20, 20)
        img = Image.fromarray(picture(i, size[1], size[0])).convert(mode)
        buf = io.BytesIO()
        exif = Image.Exif()
        if orientation is not None:
            exif[0x0112] = orientation
        img.save(buf, format=fmt, exif=exif.tobytes() if orientation is not None else b"")
        data = buf.getvalue()[:-40] if truncated else buf.getvalue()
        (folder / f"{i}.img").write_bytes(data)
        rows.append([f"{i}.img", str(i)])
        sources.append(data)
        fitting.append(
            fmt == encode and fits and mode == "RGB" and not truncated
            and (orientation is None or (keep_exif and orientation == 1))
        )  # fmt: skip
    write_csv(str(folder / "list.csv"), rows)
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"),
                        dtype=["int64"])  # fmt: skip
    packs = {}
    for reencode in (True, False):
        report = gen.generate(
            str(folder / f"{reencode}.h5"), 20, 24, encode=encode, keep_exif=keep_exif,
            workers=0, on_error="skip", reencode=reencode,
        )  # fmt: skip
        packs[reencode] = Pack(report.paths)
        assert [s.line for s in report.skipped] == [
            i + 2 for i, f in enumerate(files) if f[4]
        ]  # truncated files are bad rows whatever reencode says
    n = 0
    for i, source in enumerate(sources):
        if files[i][4]:
            continue
        stored, before = packs[False]["image"][n].tobytes(), packs[True]["image"][n].tobytes()
        if fitting[i]:
            assert stored == source
            want = np.asarray(Image.open(io.BytesIO(source)).convert("RGB"))
            np.testing.assert_array_equal(decode(stored, 3), want)
        else:
            assert stored == before
        if keep_exif:
            assert packs[False]["image.exif"][n].tobytes() == packs[True]["image.exif"][n].tobytes()
        n += 1


def test_reencode_takes_a_bool(folder, tmp_path):
    with pytest.raises(ArgumentError, match="reencode"):
        generator(folder).generate(str(tmp_path / "p.h5"), 20, 24, reencode="no")
    assert not os.listdir(tmp_path)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def test_reencode_false_finds_orientation_and_damage_where_prepare_does(tmp_path):
    """Orientation outside the EXIF block (XMP in a JPEG, an eXIf chunk after a PNG's
    pixels) is turned upright, and a file corrupt inside that still ends with its end
    marker is a bad row at packing, under reencode=False as under True."""
    from PIL import PngImagePlugin

    img = Image.fromarray(picture(1, 24, 24))  # square: turned or not, it fits the pack
    xmp = (
        '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
        'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
        'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="6"/></rdf:RDF>'
        "</x:xmpmeta>"
    )
    exif = Image.Exif()
    exif[0x0112] = 6
    files = {}
    buf = io.BytesIO()
    img.save(buf, "JPEG", xmp=xmp.encode())
    files["xmp.jpg"] = buf.getvalue()
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", xmp)
    buf = io.BytesIO()
    img.save(buf, "PNG", pnginfo=info)
    files["xmp.png"] = buf.getvalue()
    buf = io.BytesIO()
    img.save(buf, "PNG")
    plain = buf.getvalue()
    end = plain.rfind(b"IEND") - 4
    files["late.png"] = plain[:end] + _png_chunk(b"eXIf", exif.tobytes()[6:]) + plain[end:]
    damaged = bytearray(plain)
    at = plain.find(b"IDAT") + 10
    damaged[at : at + 8] = b"\xff" * 8
    files["damaged.png"] = bytes(damaged)
    rows = [["image", "label"]]
    for i, (name, data) in enumerate(files.items()):
        (tmp_path / name).write_bytes(data)
        rows.append([name, str(i)])
    write_csv(str(tmp_path / "list.csv"), rows)
    gen = FuelGenerator(file_dir=str(tmp_path), file_list=str(tmp_path / "list.csv"),
                        dtype=["int64"])  # fmt: skip
    for encode, rotated in (("JPEG", ["xmp.jpg"]), ("PNG", ["xmp.png", "late.png"])):
        packs = {}
        for reencode in (True, False):
            report = gen.generate(
                str(tmp_path / f"{encode}{reencode}.h5"), 24, 24, encode=encode, workers=0,
                on_error="skip", reencode=reencode,
            )  # fmt: skip
            assert [s.line for s in report.skipped] == [5]  # damaged.png, either way
            packs[reencode] = Pack(report.paths)
        for n, name in enumerate(files):
            if name == "damaged.png":
                break
            if name in rotated:  # turned upright: stored as re-encoded, not as read
                got = packs[False]["image"][n].tobytes()
                assert got == packs[True]["image"][n].tobytes() and got != files[name]
