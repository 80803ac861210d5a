"""Issue 11 items 3 and 17 for embedding anchors: every chunk is checked before one row is
written, and a malformed manifest is a CheckpointError naming the file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.numpy

from dualtrain import CheckpointError, EmbeddingStore, TimeMachine
from dualtrain.checkpoint.anchor_file import write_anchor

torch = pytest.importorskip("torch")
from dualtrain_torch import attach  # noqa: E402


@pytest.fixture
def saved(tmp_path):
    store = EmbeddingStore(20, 3, seed=1)
    rows = attach(store, torch.optim.SGD, lr=0.1, momentum=0.9, mode="exact")
    rows.fetch(np.array([1, 2])).sum().backward()
    rows.step()
    path = TimeMachine(save_path=tmp_path).drop_embeddings(rows, "emb")
    return path


def contents(path):
    with safetensors.safe_open(str(path), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no __iter__)
        return tensors, json.loads(f.metadata()["dualtrain"])


def write(path, tensors, manifest):
    """Written as drop_embeddings writes (header and tensor CRCs of what is given)."""
    write_anchor(path, tensors, {k: v for k, v in manifest.items() if k != "crc32c"})


def target():
    store = EmbeddingStore(20, 3, seed=2)
    return store, attach(store, torch.optim.SGD, lr=0.1, momentum=0.9, mode="exact")


def chunked(manifest, tensors, chunk):
    """The same tables cut into chunks of `chunk` rows (a file another version could write)."""
    out = {}
    for name in {k.rpartition(".")[0] for k in tensors}:
        table = tensors[f"{name}.0"]
        for i in range(0, len(table), chunk):
            out[f"{name}.{i // chunk}"] = table[i : i + chunk]
    return {**manifest, "chunk": chunk, "crc32c": None}, out


CASES = {
    "chunk missing": lambda t, m: ({k: v for k, v in t.items() if k != "weight.0"}, m),
    "extra chunk": lambda t, m: ({**t, "weight.1": t["weight.0"][:1]}, m),
    "short rows": lambda t, m: ({**t, "weight.0": t["weight.0"][:19]}, m),
    "wrong dim": lambda t, m: ({**t, "weight.0": np.zeros((20, 4), np.float32)}, m),
    "int table": lambda t, m: ({**t, "weight.0": t["weight.0"].astype(np.int32)}, m),
    "unknown table": lambda t, m: ({**t, "bogus.0": t["weight.0"]}, m),
    "lazy says no counters": lambda t, m: (t, {**m, "mode": "lazy"}),
    "chunk 0": lambda t, m: (t, {**m, "chunk": 0}),
    "chunk a string": lambda t, m: (t, {**m, "chunk": "65536"}),
    "negative rows": lambda t, m: (t, {**m, "num_rows": -20}),
    "huge rows": lambda t, m: (t, {**m, "num_rows": 2**40}),
    "no step": lambda t, m: (t, {k: v for k, v in m.items() if k != "step"}),
    "bool step": lambda t, m: (t, {**m, "step": True}),
    "slots a dict": lambda t, m: (t, {**m, "slots": {}}),
    "chunks of 7, manifest says 65536": lambda t, m: (chunked(m, t, 7)[1], m),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_embedding_anchor_changes_no_row(tmp_path, saved, case):
    tensors, manifest = contents(saved)
    manifest.pop("crc32c")
    tensors, manifest = CASES[case](tensors, manifest)
    manifest.pop("crc32c", None)
    bad = tmp_path / "bad.safetensors"
    write(bad, tensors, manifest)
    store, rows = target()
    before = store.table.copy(), store.state["momentum_buffer"].copy(), store.counters.copy()
    with pytest.raises(CheckpointError, match=str(bad)):
        TimeMachine().to_embeddings(rows, bad)
    after = store.table, store.state["momentum_buffer"], store.counters
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_flipped_byte_in_a_late_chunk_changes_no_row(tmp_path, saved):
    raw = bytearray(saved.read_bytes())
    raw[-1] ^= 0x01
    bad = tmp_path / "flip.safetensors"
    bad.write_bytes(raw)
    store, rows = target()
    before = store.table.copy()
    with pytest.raises(CheckpointError, match="CRC-32"):
        TimeMachine().to_embeddings(rows, bad)
    np.testing.assert_array_equal(store.table, before)


def test_an_anchor_chunked_differently_loads(tmp_path, saved):
    """The manifest's chunk size governs reading, not this version's CHUNK."""
    tensors, manifest = contents(saved)
    manifest, tensors = chunked(manifest, tensors, 7)
    manifest.pop("crc32c")
    other = tmp_path / "seven.safetensors"
    write(other, tensors, manifest)
    store, rows = target()
    TimeMachine().to_embeddings(rows, other)
    original, _ = contents(saved)
    np.testing.assert_array_equal(store.table, original["weight.0"])


# ---- adversarial review: the optimizer is recorded; the header has a CRC-32 -------------


def test_an_anchor_of_another_optimizer_is_refused_by_name(tmp_path):
    store = EmbeddingStore(20, 3, seed=1)
    rows = attach(store, torch.optim.RMSprop, lr=0.1, momentum=0.9, mode="exact")
    rows.fetch(np.array([1, 2])).sum().backward()
    rows.step()
    path = TimeMachine(save_path=tmp_path).drop_embeddings(rows, "rms")
    other = EmbeddingStore(20, 3, seed=2)
    table = other.table.copy()
    sgd = attach(other, torch.optim.SGD, lr=0.1, momentum=0.9, mode="exact")
    with pytest.raises(CheckpointError, match=r"torch\.optim\.RMSprop; .*torch\.optim\.SGD"):
        TimeMachine().to_embeddings(sgd, path)
    np.testing.assert_array_equal(other.table, table)
    assert not other.state["momentum_buffer"].any()


def test_a_flipped_bit_in_an_embedding_manifest_is_refused(tmp_path, saved):
    raw = bytearray(saved.read_bytes())
    at = raw.index(b'\\"step\\": 1') + len(b'\\"step\\": ')
    raw[at] ^= 0x02  # step 1 -> 3
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(bytes(raw))
    store, rows = target()
    table = store.table.copy()
    with pytest.raises(CheckpointError, match=r"header .* fails its CRC-32"):
        TimeMachine().to_embeddings(rows, bad)
    np.testing.assert_array_equal(store.table, table)
