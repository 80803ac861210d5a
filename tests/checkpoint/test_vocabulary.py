"""One vocabulary in anchor files: format versions, backend names, slot names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from dualtrain import EmbeddingStore, TimeMachine
from dualtrain.checkpoint import vocabulary
from dualtrain.checkpoint.anchor_file import Anchor
from dualtrain.errors import CheckpointError
from tests.checkpoint.crafts import Net

torch = pytest.importorskip("torch")
optax = pytest.importorskip("optax")

import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures" / "anchors"


def manifest_of(path) -> dict:
    return json.loads(Anchor(path).metadata["dualtrain"])


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_every_anchor_names_its_format_and_backend_in_the_registrys_words(tmp_path, backend):
    store = EmbeddingStore(6, 2, seed=1)
    if backend == "torch":
        rows = dualtrain_torch.attach(store, torch.optim.SGD, lr=0.1, momentum=0.9)
        module = dualtrain_torch.realize(Net(), seed=1)
        opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
        opt.step()  # no gradients: state stays empty, the entry is still written
    else:
        rows = dualtrain_jax.attach(store, optax.sgd(0.1, momentum=0.9))
        module = dualtrain_jax.realize(Net(), seed=1)
        opt = optax.sgd(0.1, momentum=0.9).init(module.params)
    tm = TimeMachine(save_path=tmp_path)
    emb = manifest_of(tm.drop_embeddings(rows, "emb"))
    craft = manifest_of(tm.drop(module, "net", optimizer=opt))
    assert emb["format"] == "dualtrain-embeddings/4" and emb["backend"] == backend
    assert craft["format"] == "dualtrain-checkpoint/4" and craft["backend"] == backend
    assert craft["optimizer"]["framework"] == backend
    assert emb["slots"] == ["momentum_buffer"]  # torch's slot name under either framework


def test_old_words_read_as_todays():
    old = {
        "format": "dualtrain-embeddings/2",
        "backend": "dualtrain_jax",
        "optimizer": {"framework": "dualtrain_torch", "form": "native"},
    }
    new = vocabulary.upgrade(old)
    assert new["backend"] == "jax" and new["optimizer"]["framework"] == "torch"
    assert new["format"] == old["format"] and old["backend"] == "dualtrain_jax"  # a copy
    assert vocabulary.upgrade(new) == new  # today's words stay as they are
    assert vocabulary.slot_name("momentum") == "momentum_buffer"
    for slot in ("momentum_buffer", "exp_avg", "exp_avg_sq", "square_avg", "sum", "step"):
        assert vocabulary.slot_name(slot) == slot
    assert set(vocabulary.BACKEND_ALIASES.values()) == set(vocabulary.BACKENDS)


@pytest.mark.parametrize(
    ("fixture", "fmt"),
    [
        ("v2-torch-adam.safetensors", "dualtrain-checkpoint/2"),
        ("v2-torch-adam.safetensors", "dualtrain-checkpoint/3"),
        ("v3-torch-adam.safetensors", "dualtrain-checkpoint/4"),
    ],
)
def test_a_format_with_crcs_is_refused_without_them(tmp_path, fixture, fmt):
    """/2 to /4 carry checksums: a file claiming one without them is refused, not read."""
    anchor = Anchor(FIXTURES / fixture)
    tensors = {k: np.array(anchor.array(k)) for k in anchor.entries}
    manifest = {**json.loads(anchor.metadata["dualtrain"]), "format": fmt}
    manifest.pop("crc32")
    bare = tmp_path / "bare.safetensors"
    safetensors.numpy.save_file(tensors, str(bare), metadata={"dualtrain": json.dumps(manifest)})
    module = dualtrain_torch.realize(Net(), seed=1)
    with pytest.raises(CheckpointError, match=f"format '{fmt}' but its header's CRC-32"):
        TimeMachine().to(module, bare)


def test_an_unknown_format_is_refused_naming_what_this_version_reads(tmp_path):
    anchor = Anchor(FIXTURES / "v2-torch-adam.safetensors")
    tensors = {k: np.array(anchor.array(k)) for k in anchor.entries}
    manifest = {**json.loads(anchor.metadata["dualtrain"]), "format": "dualtrain-checkpoint/9"}
    bad = tmp_path / "bad.safetensors"
    safetensors.numpy.save_file(tensors, str(bad), metadata={"dualtrain": json.dumps(manifest)})
    with pytest.raises(
        CheckpointError, match=r"checkpoint/9'; this reads .*checkpoint/4.*/3.*/2.*/1"
    ):
        TimeMachine().to(dualtrain_torch.realize(Net(), seed=1), bad)
