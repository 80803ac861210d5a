"""Nebulae's Fuel as its brochure shows it (issue 18, items 1 and 2).

FuelGenerator in the brochure's positional order, `modify` setting generate's settings,
the brochure's Tank `fetcher`/`prep` run as written (the object handed to fetch_fn decodes
images on indexing), `Tank.next()`, `Tank.batches_per_epoch`, `len(Tank)`, and Comburant's table.
"""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from dualtrain.errors import ArgumentError, OutOfRangeError
from dualtrain.fuel import (
    Brighten,
    Comburant,
    Contrast,
    Crop,
    Flip,
    FuelGenerator,
    Pack,
    Rotate,
    Sampling,
    Saturate,
    Tank,
    decode,
)
from dualtrain.fuel.casts import check_spec as _check_spec
from dualtrain.fuel.decoded import DecodedPack
from dualtrain.fuel.fetch import DefaultFetch
from tests.fuel.raw import make_folder

N = 10  # rows of every pack here
SIDE = 8


# --- the brochure's example, as written (module level: process workers import it) ------


def fetcher(data, idx):
    ret = {}
    ret["image"] = data["image"][idx]
    ret["label"] = data["label"][idx].astype("int64")
    return ret


def prep(data):
    # convert to channel-first format
    data["image"] = np.transpose(data["image"], (2, 0, 1)).astype("float32")
    return data


# --- data -------------------------------------------------------------------------------


def _picture(i: int) -> np.ndarray:
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    return np.stack([(xx * 20 + yy * c * 9 + 23 * i) % 256 for c in range(3)], -1).astype(np.uint8)


def _raw(folder: str, seq: bool = False) -> str:
    """N images (or N sequences of 2..4 frames) and Nebulae's file_list.csv; the folder."""
    os.makedirs(folder, exist_ok=True)
    rows = [["image", "label"]]
    for i in range(N):
        frames = [f"img_{i}_{j}.png" for j in range(2 + i % 3 if seq else 1)]
        for j, name in enumerate(frames):
            Image.fromarray(_picture(i * 5 + j)).save(os.path.join(folder, name))
        rows.append([",".join(frames), str(i % 4)])
    with open(os.path.join(folder, "file_list.csv"), "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return folder


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """An HDF5 pack, an npz pack in two shards, and an HDF5 pack of sequences."""
    root = tmp_path_factory.mktemp("nebulae_fuel")
    flat = _raw(str(root / "flat"))
    seq = _raw(str(root / "seq"), seq=True)
    gen = FuelGenerator(flat, "file_list.csv", ["vuint8", "int64"], False)
    h5 = gen.generate(str(root / "data.h5"), SIDE, SIDE, encode="PNG").paths
    npz = gen.generate(str(root / "data.npz"), SIDE, SIDE, encode="PNG", shards=2).paths
    seqs = FuelGenerator(seq, "file_list.csv", ["vuint8", "int64"], True)
    video = seqs.generate(str(root / "video.h5"), SIDE, SIDE, encode="PNG").paths
    return {"h5": h5, "npz": npz, "seq": video, "flat": flat, "root": str(root)}


# --- 1. FuelGenerator and modify --------------------------------------------------------


def test_positional_form_is_the_keyword_form(packs, tmp_path):
    flat = packs["flat"]
    by_position = FuelGenerator(flat, "file_list.csv", ["vuint8", "int64"], False)
    by_keyword = FuelGenerator(file_dir=flat, file_list="file_list.csv", dtype=["vuint8", "int64"])
    by_config = FuelGenerator(config={"file_dir": flat, "file_list": "file_list.csv",
                                      "dtype": ["vuint8", "int64"]})  # fmt: skip
    assert by_position.config == by_keyword.config == by_config.config
    assert FuelGenerator(dict(by_keyword.config)).config == by_keyword.config


def test_config_with_arguments_is_an_error_naming_both(packs):
    flat, csv_name = packs["flat"], "file_list.csv"
    cases = [
        lambda: FuelGenerator({"file_dir": flat}, file_dir=flat),
        lambda: FuelGenerator(flat, csv_name, ["vuint8", "int64"], config={"file_dir": flat}),
        lambda: FuelGenerator(config={"file_dir": flat}, dtype=["vuint8", "int64"]),
    ]
    for case in cases:
        with pytest.raises(ArgumentError, match="config and the arguments") as e:
            case()
        assert "mutually exclusive" in str(e.value)
    with pytest.raises(ArgumentError, match=r"\['file_dir'\] both by position and by keyword"):
        FuelGenerator(flat, file_dir=flat, file_list=csv_name, dtype=["vuint8", "int64"])
    with pytest.raises(ArgumentError, match="at most 7 positional"):
        FuelGenerator(flat, csv_name, ["vuint8"], False, ",", '"', False, 1)


_SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "height": st.integers(1, 9),
        "width": st.integers(1, 9),
        "channel": st.sampled_from([1, 3]),
        "encode": st.sampled_from(["JPEG", "png", "RAW"]),
        "shards": st.integers(1, 2),
        "keep_exif": st.booleans(),
    },
)


def _content(paths: list[str]) -> tuple:
    """What a pack holds, without its run id: shard count, image metadata, decoded rows."""
    pack = Pack(paths)
    rows = tuple(decode(pack["image"][i]).tobytes() for i in range(len(pack)))
    return len(paths), pack.image, pack.exif, rows


@settings(max_examples=12)
@given(_SETTINGS, st.booleans())
def test_modify_sets_generate_settings_law(packs, changes, as_dict):
    """modify(**s) then generate(dst) packs what generate(dst, **s) packs (dict form too)."""
    flat = packs["flat"]
    full = {"height": 5, "width": 6, **changes}
    base = os.path.join(packs["root"], "law")
    os.makedirs(base, exist_ok=True)
    modified = FuelGenerator(flat, "file_list.csv", ["vuint8", "int64"])
    if as_dict:
        modified.modify(config=full)
    else:
        modified.modify(**full)
    assert {k: modified.config[k] for k in full} == full
    a = modified.generate(os.path.join(base, "a.h5"), workers=0).paths
    plain = FuelGenerator(flat, "file_list.csv", ["vuint8", "int64"])
    b = plain.generate(os.path.join(base, "b.h5"), workers=0, **full).paths
    assert _content(a) == _content(b)


def test_arguments_of_generate_win_over_modify(packs, tmp_path):
    gen = FuelGenerator(packs["flat"], "file_list.csv", ["vuint8", "int64"])
    gen.modify(height=200, width=200)  # the brochure's call
    gen.modify(config={"height": 4, "width": 3})  # the brochure's dict form
    report = gen.generate(str(tmp_path / "p.npz"), width=2, encode="PNG")
    assert Pack(report.paths).image["height"] == 4
    assert Pack(report.paths).image["width"] == 2


def test_modify_checks_everything_before_changing_anything(packs, tmp_path):
    gen = FuelGenerator(packs["flat"], "file_list.csv", ["vuint8", "int64"])
    before = gen.config
    bad = [
        ({"height": 10, "width": 0}, "width must be a positive int"),
        ({"height": 10, "encode": "GIF"}, "encode must be"),
        ({"height": 10, "keep_exif": 1}, "keep_exif must be True or False"),
        ({"height": 10, "channel": 2}, "channel must be 1, 3 or 4"),
        ({"height": 10, "shards": True}, "shards must be a positive int"),
        ({"height": 10, "hieght": 10}, "config must be keys among"),
        ({"height": 10, "file_dir": str(tmp_path / "none")}, "file_dir must be an existing"),
    ]
    for changes, message in bad:
        as_keywords, as_dict = (
            (lambda c=changes: gen.modify(**c)),
            (lambda c=changes: gen.modify(config=c)),
        )
        for call in (as_keywords, as_dict):
            with pytest.raises(ArgumentError, match=message):
                call()
            assert gen.config == before
    with pytest.raises(ArgumentError, match="config and the keyword arguments"):
        gen.modify(config={"height": 3}, width=3)
    with pytest.raises(ArgumentError, match=r"height must be an int given to generate"):
        gen.generate(str(tmp_path / "p.h5"), width=4)
    assert not os.listdir(tmp_path)


def test_cross_checks_wait_for_generate(packs, tmp_path):
    gen = FuelGenerator(packs["flat"], "file_list.csv", ["vuint8", "int64"])
    gen.modify(channel=4)  # JPEG (the default) has no alpha: an error only if generated so
    with pytest.raises(ArgumentError, match="channel=4"):
        gen.generate(str(tmp_path / "p.h5"), 4, 4)
    gen.modify(encode="PNG")
    report = gen.generate(str(tmp_path / "p.h5"), 4, 4)
    assert Pack(report.paths).image["channel"] == 4


# --- 2. the Tank example ----------------------------------------------------------------


def test_the_brochure_tank_example_feeds_a_craft(packs):
    import torch

    from dualtrain import Craft, dock
    from dualtrain_torch import realize

    class Net(Craft):
        def __init__(self, nclass, scope="NEB"):
            super().__init__(scope)
            self.flat = dock.Reshape()
            self.fc = dock.Dense(3 * SIDE * SIDE, nclass)

        def run(self, x):
            return self.fc(self.flat(x, (-1, 3 * SIDE * SIDE)))

    spec = {"image": "vuint8", "label": "int64"}
    tank = Tank(packs["h5"], spec, 4, True, True, fetcher, prep, to="torch")
    assert len(tank) == N and tank.batches_per_epoch == 3
    with pytest.warns(DeprecationWarning, match="Tank.batches_per_epoch"):
        assert tank.MPE == 3  # Nebulae's name, deprecated on dualtrain's Tank
    batch = tank.next()
    assert batch["image"].shape == (4, 3, SIDE, SIDE) and batch["image"].dtype == torch.float32
    assert batch["label"].dtype == torch.int64
    net = realize(Net(4), seed=0)
    loss = torch.nn.functional.cross_entropy(net(batch["image"] / 255), batch["label"])
    loss.backward()
    for _ in range(tank.batches_per_epoch - 1):
        tank.next()
    assert tank.epoch == 1 and tank.position == 0  # next() crossed into epoch 1


@pytest.mark.parametrize("which", ["h5", "npz", "seq"])
@settings(max_examples=20)
@given(index=st.integers(-N, N - 1), numpy_int=st.booleans())
def test_fetch_fn_reads_decoded_cells_law(packs, which, index, numpy_int):
    """data[key][i] == what the default fetch serves for row i (negative: from the end)."""
    pack = Pack(packs[which])
    view = DecodedPack(pack)
    spec = _check_spec(pack, {"image": "uint8", "label": "int64"}, "safe")
    row = index % N
    expected = DefaultFetch(pack, spec)(pack, row)
    i = np.int64(index) if numpy_int else index
    image = view["image"][i]
    assert image.dtype == np.uint8 and np.array_equal(image, expected["image"])
    assert image.shape[-3:] == (SIDE, SIDE, 3)
    if which == "seq":
        assert image.shape[0] == 2 + row % 3  # (T, H, W, C)
    assert view["label"][i].astype("int64") == expected["label"] == row % 4
    raw = view.raw["image"][row]  # the Pack: encoded bytes (a list of them for sequences)
    assert bytes((raw[0] if which == "seq" else raw)[:4]) == b"\x89PNG"


def test_out_of_range_and_bad_indexes_are_clear(packs):
    view = DecodedPack(Pack(packs["npz"]))
    for index in (N, -N - 1, np.int32(N)):
        with pytest.raises(IndexError, match=f"index {int(index)} is out of range") as e:
            view["image"][index]
        assert isinstance(e.value, OutOfRangeError)
        assert "column 'image'" in str(e.value) and f"{N} rows" in str(e.value)
    for index in (True, 1.0, "0", slice(0, 2)):
        with pytest.raises(ArgumentError, match="index must be an int row number"):
            view["label"][index]
    with pytest.raises(ArgumentError, match="key must be one of"):
        view["lable"]


def test_every_worker_kind_serves_the_same_batches(packs):
    spec = {"image": "uint8", "label": "int64"}
    runs = []
    for kw in ({}, {"workers": 2}, {"workers": 2, "worker_mode": "process"}):
        with Tank(packs["npz"], spec, 4, True, True, fetcher, prep, seed=3, **kw) as tank:
            runs.append([tank.next() for _ in range(tank.batches_per_epoch + 1)])
    for run in runs[1:]:
        for a, b in zip(runs[0], run, strict=True):
            assert np.array_equal(a["image"], b["image"]) and np.array_equal(a["label"], b["label"])


def test_fetch_fns_written_for_encoded_cells_still_work(packs):
    """decode() of a cell decoded already returns it: fetch_fns that decoded keep working."""
    view = DecodedPack(Pack(packs["h5"]))
    image = view["image"][3]
    assert decode(image) is image
    assert decode(image, channel=1).shape == (SIDE, SIDE, 1)
    assert np.array_equal(decode(view.raw["image"][3]), image)


def test_cells_are_writable_copies(tmp_path):
    """A fetch_fn may change what it read in place (h5py gave it fresh arrays too)."""
    make_folder(str(tmp_path), 4, size=(SIDE, SIDE))
    gen = FuelGenerator(str(tmp_path), "list.csv", ["vuint8", "int64", "float32", "vint32", "str"])
    view = DecodedPack(Pack(gen.generate(str(tmp_path / "p.h5"), SIDE, SIDE).paths))
    tags = view["tags"][3]
    assert tags.tolist() == [0, 3, 6]
    tags += 1  # a read-only view of the mapped file would raise here
    assert view["tags"][3].tolist() == [0, 3, 6]


# --- 3. Comburant's table ---------------------------------------------------------------


def _augment(sample):
    sample["image"] = AUGMENT(sample["image"])
    return sample


AUGMENT = Comburant(
    Flip(), Crop(area=(0.5, 1.0)), Rotate(10), Brighten(0.1), Contrast(0.2), Saturate(0.2)
)


def test_comburant_table_in_a_tank(packs):
    spec = {"image": "uint8", "label": "int64"}
    one = Tank(packs["h5"], spec, 4, True, True, fetcher, _augment, seed=1).next()
    two = Tank(packs["h5"], spec, 4, True, True, fetcher, _augment, seed=1).next()
    assert one["image"].shape == (4, SIDE, SIDE, 3) and np.array_equal(one["image"], two["image"])
    assert Comburant()(_picture(1), key=(0, 0, 0)).tobytes() == _picture(1).tobytes()


def test_sampling_and_numpy_ints(packs):
    view = DecodedPack(Pack(packs["seq"]))
    frames = view["image"][-1]  # row 9: 2 + 9 % 3 = 2 frames
    kept = Comburant(Sampling(np.int64(2)))(np.concatenate([frames, frames]), key=(0, 0, 9))
    assert len(kept) == 2
    same = Comburant(Flip(p=1.0))(frames[0], key=(np.uint64(0), np.int64(1), np.int32(2)))
    assert np.array_equal(same, Comburant(Flip(p=1.0))(frames[0], key=(0, 1, 2)))


def test_the_old_depot_path_warns_and_still_gives_dualtraints_names():
    import importlib
    import sys

    sys.modules.pop("dualtrain.fuel.depot", None)
    with pytest.warns(DeprecationWarning, match="dualtrain.compat.nebulae.fuel.depot"):
        depot = importlib.import_module("dualtrain.fuel.depot")
    assert depot.Tank is Tank and depot.Comburant is Comburant
    table = ("Flip", "Crop", "Rotate", "Brighten", "Contrast", "Saturate", "Sampling")
    assert all(getattr(depot, name) is globals()[name] for name in table)
