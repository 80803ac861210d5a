"""Anchors older versions wrote still load, to the values they held (committed fixtures).

The files under tests/fixtures/anchors/ were made by tests/fixtures/make_anchors.py at the
format each one's name says (``v3-``: ``dualtrain-checkpoint/3``, one zlib CRC-32 a
tensor; ``v2-``: ``/2``; ``v1-``, ``v1n-``: ``/1``, native and neutral optimizer form);
``expected.json`` holds what the writer had in memory then: every tensor, the predictions
in eval mode, the optimizer's slots (torch's names), the step. Each anchor is loaded by
today's reader into both frameworks and checked against them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dualtrain import Craft, EmbeddingStore, TimeMachine, dock
from dualtrain.checkpoint.anchor_file import Anchor
from dualtrain.checkpoint.time_machine import BOOKKEEPING

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402

HERE = Path(__file__).parents[1] / "fixtures" / "anchors"
EXPECTED = json.loads((HERE / "expected.json").read_text())
CRAFTS = sorted(k for k, v in EXPECTED.items() if v["kind"] == "craft")
EMBEDDINGS = sorted(k for k, v in EXPECTED.items() if v["kind"] == "embeddings")
X = np.linspace(-1.0, 1.0, 15, dtype=np.float32).reshape(5, 3)  # make_anchors.X


class Tiny(Craft):
    """make_anchors' Craft: Dense -> BatchNorm -> tanh -> Dense."""

    def __init__(self) -> None:
        super().__init__("Tiny")
        self.fc1 = dock.Dense(3, 4)
        self.bn = dock.BatchNorm(4)
        self.fc2 = dock.Dense(4, 2)

    def run(self, x):
        return self.fc2(dock.tanh(self.bn(self.fc1(x))))


def torch_optimizer(kind, params):
    if kind == "sgd-momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.05)


def optax_optimizer(kind):
    return optax.sgd(0.1, momentum=0.9) if kind == "sgd-momentum" else optax.adam(0.05)


def close(got, want, what):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want), 1e-6, 1e-7, what)


def test_every_format_ever_written_has_a_fixture():
    formats = {v["format"] for v in EXPECTED.values()}
    assert formats == {
        "dualtrain-checkpoint/1",
        "dualtrain-checkpoint/2",
        "dualtrain-checkpoint/3",
        "dualtrain-embeddings/1",
        "dualtrain-embeddings/2",
        "dualtrain-embeddings/3",
    }
    for name, values in EXPECTED.items():  # the file is what the record says it is
        assert json.loads(Anchor(HERE / name).metadata["dualtrain"])["format"] == values["format"]


@pytest.mark.parametrize("name", CRAFTS)
def test_an_old_craft_anchor_resumes_under_torch(name):
    want = EXPECTED[name]
    module = dualtrain_torch.realize(Tiny(), seed=9)
    kind = want["optimizer"]
    opt = torch_optimizer(kind, module.parameters())
    restored = TimeMachine().to(module, HERE / name, optimizer=opt)
    assert restored.step == want["step"] and restored.extra == want["extra"]
    assert restored.manifest["backend"] == want["backend"]  # "torch" / "jax", both formats
    for key, value in module.state_dict().items():
        if key in restored.manifest["names"]:
            close(value.numpy(), want["tensors"][key], key)
        else:  # JAX and the first format keep no batch count: torch's is kept as it was
            assert key.rpartition(".")[2] in BOOKKEEPING
    module.eval()
    with torch.no_grad():
        close(module(torch.from_numpy(X)).numpy(), want["predictions"], "predictions")
    params = dict(module.named_parameters())
    for slot, values in want["slots"].items():
        for pname, value in values.items():
            close(opt.state[params[pname]][slot].numpy(), value, f"{slot} of {pname}")
    if kind != "sgd-momentum":
        assert {int(opt.state[p]["step"]) for p in params.values()} == {want["opt_step"]}


@pytest.mark.parametrize("name", CRAFTS)
def test_an_old_craft_anchor_resumes_under_jax(name):
    want = EXPECTED[name]
    module = dualtrain_jax.realize(Tiny(), seed=9)
    opt = optax_optimizer(want["optimizer"]).init(module.params)
    restored = TimeMachine().to(module, HERE / name, optimizer=opt)
    assert restored.step == want["step"] and restored.extra == want["extra"]
    module = restored.module if hasattr(restored, "module") else module
    for key, value in {**module.params, **module.state}.items():
        close(value, want["tensors"][key], key)
    out, _ = module.apply(module.params, module.state, X, train=False)
    close(out, want["predictions"], "predictions")
    first = restored.optimizer[0]
    fields = {"momentum_buffer": "trace", "exp_avg": "mu", "exp_avg_sq": "nu"}
    for slot, values in want["slots"].items():
        for pname, value in values.items():
            close(getattr(first, fields[slot])[pname], value, f"{slot} of {pname}")
    if want["optimizer"] != "sgd-momentum":
        assert int(first.count) == want["opt_step"]


def attach(backend, kind, store):
    if backend == "torch":
        if kind == "sgd-momentum":
            return dualtrain_torch.attach(store, torch.optim.SGD, lr=0.1, momentum=0.9)
        return dualtrain_torch.attach(store, torch.optim.Adam, lr=0.05)
    return dualtrain_jax.attach(store, optax_optimizer(kind))


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("name", EMBEDDINGS)
def test_an_old_embedding_anchor_resumes(name, backend):
    want = EXPECTED[name]
    store = EmbeddingStore(8, 3, std=0.5, seed=0)
    rows = attach(backend, want["optimizer"], store)
    manifest = TimeMachine().to_embeddings(rows, HERE / name)
    assert manifest["extra"] == want["extra"] and rows.steps == want["step"]
    assert manifest["backend"] == want["backend"]  # "dualtrain_torch" on disk before /3
    close(store.table, want["table"], "table")
    assert sorted(store.state) == sorted(want["slots"])
    for slot, value in want["slots"].items():
        close(store.state[slot], value, slot)
