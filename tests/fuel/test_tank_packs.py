"""A pack is checked when opened and while read: malformed metadata, shards of different
runs, and files changed under a reader are PackErrors naming the file (issue 11: 8, 9, 17)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from dualtrain import ArgumentError, PackError
from dualtrain.fuel import FuelGenerator, Pack, Tank
from dualtrain.fuel.layout import META_KEY
from tests.fuel.raw import DTYPES, make_folder

N = 12
SPEC = {"image": "uint8", "label": "int64", "tags": "vint32"}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One single-file HDF5 pack, one npz pack and a 3-shard HDF5 pack (fresh copies per test)."""
    folder = tmp_path_factory.mktemp("raw")
    make_folder(str(folder), N, size=(10, 12))
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    one = gen.generate(str(folder / "one.h5"), 8, 8, encode="PNG", workers=0).paths
    npz = gen.generate(str(folder / "one.npz"), 8, 8, encode="PNG", workers=0).paths
    three = gen.generate(str(folder / "s.h5"), 8, 8, encode="PNG", shards=3, workers=0).paths
    return {"one": one, "npz": npz, "three": three}


def copies(made, name, tmp_path) -> list[str]:
    out = []
    for path in made[name]:
        dst = str(tmp_path / os.path.basename(path))
        shutil.copy(path, dst)
        out.append(dst)
    return out


def read_meta(path: str) -> dict:
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs[META_KEY])


def write_meta(path: str, meta: dict | str) -> None:
    with h5py.File(path, "r+") as f:
        f.attrs[META_KEY] = meta if isinstance(meta, str) else json.dumps(meta)


def edit_meta(path: str, edit) -> None:
    meta = read_meta(path)
    edit(meta)
    write_meta(path, meta)


def serve(paths) -> None:
    with Tank(paths, SPEC, 4, shuffle=False) as tank:
        for _ in range(tank.batches_per_epoch):
            tank.next()


# --- 17: malformed metadata and datasets -----------------------------------------------------

BAD_META = {
    "bad JSON": "{not json",
    "a list": json.dumps([1, 2]),
    "no count": lambda m: m.pop("count"),
    "negative count": lambda m: m.update(count=-1),
    "bool count": lambda m: m.update(count=True),
    "too large count": lambda m: m.update(count=10**6),
    "count one too many": lambda m: m.update(count=m["count"] + 1),
    "no keys": lambda m: m.pop("keys"),
    "no columns": lambda m: m.pop("columns"),
    "keys and columns differ": lambda m: m["keys"].append("ghost"),
    "bad column type": lambda m: m["columns"]["label"].update(type="int65"),
    "bad kind": lambda m: m["columns"]["label"].update(kind="video"),
    "no kind": lambda m: m["columns"]["label"].pop("kind"),
    "bad shape": lambda m: m["columns"]["label"].update(shape=[-1]),
    "wrong shape": lambda m: m["columns"]["box"].update(shape=[4]),
    "wrong dtype": lambda m: m["columns"]["label"].update(type="int32"),
    "image not a dict": lambda m: m.update(image=[8, 8]),
    "image dtype a list": lambda m: m["image"].update(dtype=["uint8"]),
    "image height -1": lambda m: m["image"].update(height=-1),
    "image encode GIF": lambda m: m["image"].update(encode="GIF"),
    "image channel 2": lambda m: m["image"].update(channel=2),
    "deep colour image": lambda m: m["image"].update(dtype="uint16"),
    "image channel lies": lambda m: m["image"].update(channel=1),
    "image size lies": lambda m: m["image"].update(width=9),
    "shard beyond shards": lambda m: m.update(shard=3, shards=2),
    "bad run": lambda m: m.update(run="not-a-run-id"),
    "version 99": lambda m: m.update(version=99),
}


@pytest.mark.parametrize("case", list(BAD_META))
def test_malformed_metadata_is_a_pack_error_naming_the_file(made, tmp_path, case):
    (path,) = copies(made, "one", tmp_path)
    bad = BAD_META[case]
    if isinstance(bad, str):
        write_meta(path, bad)
    else:
        edit_meta(path, bad)
    with pytest.raises(PackError, match=r"one\.h5"):
        serve([path])


def test_a_file_that_is_no_pack_is_named(made, tmp_path):
    (path,) = copies(made, "one", tmp_path)
    edit_meta(path, lambda m: m.update(format="someone.else"))
    with pytest.raises(ArgumentError, match=r"one\.h5"):
        Pack(path)
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"\x89HDF not really" * 10)
    with pytest.raises(PackError, match=r"junk\.h5"):
        Pack(str(junk))


@pytest.mark.parametrize(
    ("dataset", "values"),
    [
        ("image.offsets", "descending"),  # offsets not monotone
        ("image.offsets", "beyond"),  # the last offset past the values
        ("tags.offsets", "beyond"),
        ("name.offsets", "not from 0"),
    ],
)
def test_bad_offsets_are_a_pack_error_naming_the_file(made, tmp_path, dataset, values):
    (path,) = copies(made, "one", tmp_path)
    with h5py.File(path, "r+") as f:
        offsets = f[dataset][()]
        if values == "descending":
            offsets[3], offsets[4] = offsets[4], offsets[3] - 1
        elif values == "beyond":
            offsets[-1] = offsets[-1] + 10**9
        else:
            offsets[0] = 5
        f[dataset][...] = offsets
    with pytest.raises(PackError, match=rf"one\.h5.*{dataset}"):
        Tank(path, {"image": "uint8", "tags": "vint32", "name": "str"}, 4).next()


def test_malformed_npz_metadata_and_members_are_named(made, tmp_path):
    (path,) = copies(made, "npz", tmp_path)
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    bad = dict(arrays)
    bad[META_KEY] = np.frombuffer(b"{oops", np.uint8)
    np.savez(path, **bad)
    with pytest.raises(PackError, match=r"one\.npz"):
        Pack(path)
    bad = dict(arrays)
    bad["label"] = bad["label"][:-2]  # fewer rows than the metadata's count
    np.savez(path, **bad)
    with pytest.raises(PackError, match=r"one\.npz.*'label'"):
        Pack(path)
    np.savez(path, **arrays)
    serve([path])


# --- 8: packs are sets -------------------------------------------------------------------------

RUN_A, RUN_B = "a" * 32, "0123456789abcdef" * 2


def with_runs(paths, runs) -> None:
    for path, run in zip(paths, runs, strict=True):
        edit_meta(path, lambda m, run=run: m.update(run=run) if run else m.pop("run", None))


def test_shards_of_one_run_serve_and_old_packs_without_run_ids_load(made, tmp_path):
    paths = copies(made, "three", tmp_path)
    with_runs(paths, [None, None, None])  # written before run ids
    serve(paths)
    serve(paths[:2])  # old packs: any list of shards, as before
    with_runs(paths, [RUN_A] * 3)
    serve(paths)
    serve(paths[::-1])  # any order of the whole set


def test_shards_of_different_runs_are_refused_naming_them(made, tmp_path):
    paths = copies(made, "three", tmp_path)
    with_runs(paths, [RUN_A, RUN_B, RUN_A])
    with pytest.raises(PackError, match="different generate runs") as e:
        Tank(paths, SPEC, 4)
    assert all(os.path.basename(p) in str(e.value) for p in paths)
    assert RUN_A in str(e.value) and RUN_B in str(e.value)
    with_runs(paths, [RUN_A, None, RUN_A])  # a run id next to none: a mix too
    with pytest.raises(PackError, match="different generate runs"):
        Tank(paths, SPEC, 4)


def test_a_missing_or_repeated_shard_is_refused(made, tmp_path):
    paths = copies(made, "three", tmp_path)
    with_runs(paths, [RUN_A] * 3)
    with pytest.raises(PackError, match="shard 1 is missing") as e:
        Tank([paths[0], paths[2]], SPEC, 4)
    assert os.path.basename(paths[0]) in str(e.value)
    with pytest.raises(PackError, match="shard 0 is given 2 times"):
        Tank([paths[0], *paths], SPEC, 4)
    edit_meta(paths[2], lambda m: m.update(shards=4))
    with pytest.raises(PackError, match="shard counts differ"):
        Tank(paths, SPEC, 4)


def test_shards_with_other_columns_are_a_pack_error(made, tmp_path):
    paths = copies(made, "three", tmp_path)
    edit_meta(paths[1], lambda m: m["columns"]["label"].update(type="int32"))
    with pytest.raises(PackError, match="columns"):
        Tank(paths, SPEC, 4)


# --- 9: a pack changed under a reader ---------------------------------------------------------

_READER = textwrap.dedent(
    """
    import os, sys
    from dualtrain import PackError
    from dualtrain.fuel import Tank

    path, how, workers, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    tank = Tank(path, {"image": "uint8", "label": "int64", "tags": "vint32"}, 2,
                shuffle=False, workers=workers, worker_mode=mode, prefetch=0)
    tank.next()
    size = os.path.getsize(path)
    if how == "truncate":
        os.truncate(path, 4096)
    elif how == "rewrite":  # same size, new bytes, in place
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(bytes(size - size // 2))
    elif how == "replace":
        with open(path, "rb") as f:
            data = f.read()
        with open(path + ".new", "wb") as f:
            f.write(data)
        os.replace(path + ".new", path)
    elif how == "remove":
        os.remove(path)
    try:
        for _ in range(20):
            tank.next()
    except PackError as e:
        print("PackError:", e)
        sys.exit(0)
    print("served a changed pack")
    sys.exit(3)
    """
)


@pytest.mark.parametrize("how", ["truncate", "rewrite", "replace", "remove"])
@pytest.mark.parametrize(("workers", "mode"), [(0, "thread"), (2, "thread")])
def test_a_pack_changed_under_a_tank_is_a_pack_error_not_a_crash(
    made, tmp_path, how, workers, mode
):
    (path,) = copies(made, "one", tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", _READER, path, how, str(workers), mode],
        capture_output=True, text=True, timeout=120, cwd=os.getcwd(),
    )  # fmt: skip
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr[-2000:])
    assert "PackError" in run.stdout and "one.h5" in run.stdout
    if how != "remove":
        assert "changed since it was opened" in run.stdout


@pytest.mark.slow
def test_a_pack_changed_under_worker_processes_is_a_pack_error(made, tmp_path):
    (path,) = copies(made, "one", tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", _READER, path, "truncate", "2", "process"],
        capture_output=True, text=True, timeout=300, cwd=os.getcwd(),
    )  # fmt: skip
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr[-2000:])
    assert "PackError" in run.stdout


def test_a_pack_changed_between_open_and_first_read_is_caught(made, tmp_path):
    (path,) = copies(made, "one", tmp_path)
    pack = Pack(path)
    tank = Tank(path, SPEC, 4)
    with open(path, "ab") as f:
        f.write(b"more")
    with pytest.raises(PackError, match=r"one\.h5.*size"):
        pack.check()
    with pytest.raises(PackError, match="changed since it was opened"):
        pack["label"][0]  # the first read opens the file, and checks it is the same one
    with pytest.raises(PackError, match="changed since it was opened"):
        tank.next()


_DIRECT = textwrap.dedent(
    """
    import os, sys, time
    from dualtrain import PackError
    from dualtrain.fuel import Pack

    pack = Pack(sys.argv[1])
    image = pack["image"]
    image[0]
    os.truncate(sys.argv[1], 4096)
    time.sleep(0.01)  # longer than the re-check interval (1 ms)
    try:
        for i in range(len(pack)):
            image[i].sum()
    except PackError as e:
        print("PackError:", e)
        sys.exit(0)
    sys.exit(3)
    """
)


def test_direct_reads_of_a_truncated_pack_are_a_pack_error_not_a_crash(made, tmp_path):
    (path,) = copies(made, "one", tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", _DIRECT, path], capture_output=True, text=True, timeout=120,
        cwd=os.getcwd(),
    )  # fmt: skip
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr[-2000:])
    assert "changed since it was opened" in run.stdout


def _edit_dataset(path: str, name: str, edit) -> None:
    with h5py.File(path, "r+") as f:
        values = f[name][()]
        edit(values)
        f[name][...] = values


@pytest.mark.parametrize(
    ("name", "edit", "says"),
    [
        ("image", lambda a: a.__setitem__(slice(10, 40), 0), "column 'image', row 0"),  # bytes
        # A shifted offset fails its checksum (issue 27) when the offsets are first read.
        ("image.offsets", lambda o: o.__setitem__(1, o[1] + 5),
         r"dataset 'image\.offsets' does not match its checksum"),
        ("name", lambda a: a.__setitem__(0, 0xFF), "column 'name', row 0"),  # not UTF-8
    ],
)  # fmt: skip
def test_corrupt_stored_values_are_a_pack_error_naming_file_column_and_row(
    made, tmp_path, name, edit, says
):
    (path,) = copies(made, "one", tmp_path)
    _edit_dataset(path, name, edit)
    tank = Tank(path, {"image": "uint8", "name": "str"}, 4, shuffle=False)
    with pytest.raises(PackError, match=rf"one\.h5: {says}"):
        tank.next()
    tank.close()


def test_an_image_depth_that_lies_is_a_pack_error_at_read(made, tmp_path):
    (path,) = copies(made, "one", tmp_path)
    edit_meta(path, lambda m: m["image"].update(dtype="uint16", channel=1))
    tank = Tank(path, {"image": "uint16"}, 4, shuffle=False)
    with pytest.raises(PackError, match=r"one\.h5: column 'image', row 0.*uint8.*uint16"):
        tank.next()
    tank.close()


def test_close_forgets_the_file_so_next_reads_a_replaced_pack(made, tmp_path):
    (path,) = copies(made, "one", tmp_path)
    tank = Tank(path, {"label": "int64", "name": "str"}, 4, shuffle=False)
    first = tank.next()["name"]
    shutil.copy(made["one"][0], path + ".new")  # the same pack, regenerated: a new file
    os.replace(path + ".new", path)
    with pytest.raises(PackError, match="changed since it was opened"):
        tank.next()
    tank.close()
    assert tank.next()["name"] == ["item 4", "item 5", "item 6", "item 7"]  # reopened
    assert first == ["item 0", "item 1", "item 2", "item 3"]
    tank.close()
    other = str(tmp_path / "other.h5")
    FuelGenerator(file_dir=os.path.dirname(made["one"][0]),
                  file_list=os.path.join(os.path.dirname(made["one"][0]), "list.csv"),
                  dtype=DTYPES).generate(other, 8, 6, encode="PNG", workers=0)  # fmt: skip
    os.replace(other, path)  # another layout (width 6): re-validated, refused
    with pytest.raises(PackError, match=r"another layout.*image"):
        tank.next()
    tank.close()
