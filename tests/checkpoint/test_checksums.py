"""The anchors' checksums: CRC-32C by chunk (/4), every chunk checked, older CRC-32s still read.

Laws: the CRC-32C equals the polynomial's definition (a bitwise reference here) and its
published check value; an anchor's table has one value per `CHUNK` bytes of each tensor;
one flipped byte anywhere in any tensor is refused by name, whatever the chunk size, and an
untouched anchor loads to what was written; anchors of /3 (one zlib CRC-32 a tensor) are
still checked with theirs.
"""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.checkpoint import anchor_file
from dualtrain.checkpoint.anchor_file import CHUNK, Anchor, write_anchor
from dualtrain.errors import CheckpointError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "anchors"
FORMAT = "dualtrain-checkpoint/4"


def reference_crc32c(data: bytes) -> int:
    """CRC-32C from its definition: reflected Castagnoli polynomial 0x82F63B78, bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_the_crc32c_is_the_castagnoli_crc_with_its_published_check_value():
    assert crc32c.crc32c(b"123456789") == 0xE3069283 == reference_crc32c(b"123456789")


@given(st.binary(max_size=300))
def test_the_crc32c_equals_its_definition(data):
    assert crc32c.crc32c(data) == reference_crc32c(data)


def _read(path: Path) -> tuple[Anchor, dict]:
    anchor = Anchor(path)
    return anchor, anchor.manifest(FORMAT)


def test_a_tensor_over_one_chunk_has_one_crc32c_per_chunk_and_loads(tmp_path):
    big = np.arange(CHUNK // 4 + 1000, dtype=np.float32)  # one chunk and 4,000 bytes
    tensors = {"big": big, "small": np.ones(3, np.int8), "empty": np.zeros((0, 4), np.float32)}
    write_anchor(tmp_path / "a.safetensors", tensors, {"format": FORMAT})
    anchor, manifest = _read(tmp_path / "a.safetensors")
    table = manifest["crc32c"]
    view = memoryview(big).cast("B")
    assert table["big"] == [crc32c.crc32c(view[:CHUNK]), crc32c.crc32c(view[CHUNK:])]
    assert table["small"] == [crc32c.crc32c(tensors["small"].tobytes())]
    assert table["empty"] == []
    for name, value in tensors.items():
        np.testing.assert_array_equal(anchor.array(name), value)


def test_a_flipped_byte_in_a_later_chunk_of_one_tensor_is_refused_by_name(tmp_path):
    big = np.arange(CHUNK // 4 * 2 + 10, dtype=np.float32)
    path = tmp_path / "a.safetensors"
    write_anchor(path, {"big": big, "w": np.ones(4, np.float32)}, {"format": FORMAT})
    anchor, _ = _read(path)
    at = anchor.entries["big"].begin + CHUNK + 12_345  # in the second of three chunks
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(raw)
    anchor, _ = _read(path)
    anchor.array("w")  # the other tensor is intact
    with pytest.raises(CheckpointError, match=r"tensor 'big' fails its CRC-32C check"):
        anchor.verify()


@settings(max_examples=40, deadline=None)
@given(
    chunk=st.sampled_from([8, 64, 1000]),
    sizes=st.lists(st.integers(0, 700), min_size=1, max_size=4),
    where=st.floats(0, 1, exclude_max=True),
    bit=st.integers(0, 7),
    threaded=st.booleans(),
)
def test_one_flipped_bit_anywhere_is_refused_whatever_the_chunk_size(
    tmp_path_factory, chunk, sizes, where, bit, threaded
):
    folder = tmp_path_factory.mktemp("flip")
    rng = np.random.default_rng(len(sizes))
    tensors = {f"t{i}": rng.integers(0, 255, n, dtype=np.uint8) for i, n in enumerate(sizes)}
    path = folder / "a.safetensors"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(anchor_file, "CHUNK", chunk)  # writer and reader alike: the logic, small
        if threaded:  # the pool's path, which a small anchor does not take by itself
            mp.setattr(anchor_file, "_PARALLEL_BYTES", 0)
        write_anchor(path, tensors, {"format": FORMAT})
        anchor, manifest = _read(path)
        for name, value in tensors.items():
            assert len(manifest["crc32c"][name]) == -(-value.nbytes // chunk)
            np.testing.assert_array_equal(anchor.array(name), value)
        total = sum(sizes)
        if total == 0:
            return
        data_start = min(e.begin for e in anchor.entries.values())
        raw = bytearray(path.read_bytes())
        raw[data_start + int(where * total)] ^= 1 << bit
        flipped = folder / "flipped.safetensors"
        flipped.write_bytes(raw)
        anchor, _ = _read(flipped)
        with pytest.raises(CheckpointError, match="fails its CRC-32C check"):
            anchor.verify()


def test_an_anchor_of_format_3_is_checked_with_its_zlib_crc32s(tmp_path):
    source = FIXTURES / "v3-torch-adam.safetensors"
    anchor = Anchor(source)
    manifest = anchor.manifest(FORMAT, older=("dualtrain-checkpoint/3",))
    assert "crc32c" not in manifest and set(manifest["crc32"]) == set(anchor.entries)
    for name, entry in anchor.entries.items():
        data = bytes(memoryview(anchor._map)[entry.begin : entry.end])
        assert manifest["crc32"][name] == zlib.crc32(data)
    anchor.verify()
    # A flipped byte in it is refused with the old check's name.
    copy = tmp_path / "v3.safetensors"
    shutil.copy(source, copy)
    name, entry = max(anchor.entries.items(), key=lambda kv: kv[1].end - kv[1].begin)
    raw = bytearray(copy.read_bytes())
    raw[entry.begin] ^= 0x01
    copy.write_bytes(raw)
    flipped = Anchor(copy)
    flipped.manifest(FORMAT, older=("dualtrain-checkpoint/3",))
    with pytest.raises(CheckpointError, match=f"tensor '{name}' fails its CRC-32 check"):
        flipped.verify()


def test_the_header_room_holds_the_widest_table(tmp_path):
    """The header is written last into room reserved for the widest CRC-32Cs: the file is a
    valid safetensors file whatever the values (here at their widest, 2**32 - 1)."""
    tensors = {"a": np.zeros(CHUNK + 1, np.uint8), "b": np.zeros(0, np.float32)}
    manifest = {"format": FORMAT}
    length = anchor_file.header_length(tensors, manifest)
    write_anchor(tmp_path / "a.safetensors", tensors, manifest)
    with open(tmp_path / "a.safetensors", "rb") as f:
        assert int.from_bytes(f.read(8), "little") == length
        header = json.loads(f.read(length))
    assert len(json.loads(header["__metadata__"]["dualtrain"])["crc32c"]["a"]) == 2
