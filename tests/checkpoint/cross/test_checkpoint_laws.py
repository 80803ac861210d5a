"""TimeMachine: checkpoints cross torch <-> JAX, with optimizer state, and fail loudly."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dualtrain
from dualtrain import ArgumentError, CheckpointError, Craft, TimeMachine, dock

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy
from dualtrain_jax import craft as jcraft  # noqa: E402
from dualtrain_torch import craft as tcraft  # noqa: E402
from tests.checkpoint.crafts import MLP  # noqa: E402

DATA = np.random.default_rng(0).normal(size=(32, 8)), np.random.default_rng(1).integers(0, 3, 32)

OPTIMIZERS = {
    "sgd": (
        lambda p, lr: torch.optim.SGD(p, lr, momentum=0.9),
        lambda lr: optax.sgd(lr, momentum=0.9),
    ),
    "adam": (lambda p, lr: torch.optim.Adam(p, lr), lambda lr: optax.adam(lr)),
    "adamw": (
        lambda p, lr: torch.optim.AdamW(p, lr, weight_decay=0.1),
        lambda lr: optax.adamw(lr, weight_decay=0.1),
    ),
}


def torch_steps(module, optimizer, n):
    x, y = (torch.from_numpy(a) for a in DATA)
    x = x.to(next(module.parameters()).dtype)
    module.train()
    for _ in range(n):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()


def jax_steps(module, tx, opt_state, n):
    x, y = (jnp.asarray(a) for a in DATA)

    def loss(p, s):
        out, s = module.apply(p, s, x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(out, y).mean(), s

    params, state = module.params, module.state
    for _ in range(n):
        (_, state), grads = jax.value_and_grad(loss, has_aux=True)(params, state)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    module.params, module.state = params, state
    return opt_state


def canonical(module):
    """torch's tensors that JAX also keeps (not torch's bookkeeping, num_batches_tracked)."""
    from dualtrain_torch.checkpoint import export_tensors

    return {k: v for k, v in export_tensors(module).items() if "num_batches" not in k}


def jax_values(module):
    return {k: np.asarray(v) for k, v in {**module.params, **module.state}.items()}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@settings(max_examples=4)
@given(lr=st.floats(1e-3, 5e-2), before=st.integers(1, 3), after=st.integers(1, 3))
def test_stopped_under_torch_resumed_under_jax_equals_continuing_under_torch(
    tmp_path_factory, name, lr, before, after
):
    make_torch, make_optax = OPTIMIZERS[name]
    tm = TimeMachine(save_path=tmp_path_factory.mktemp("ckpt"))
    with jax.enable_x64(True):
        craft = MLP()
        module = tcraft.realize(craft, seed=1, dtype="float64")
        optimizer = make_torch(module.parameters(), lr)
        torch_steps(module, optimizer, before)
        anchor = tm.drop(module, optimizer=optimizer, step=before)
        torch_steps(module, optimizer, after)

        jm = jcraft.realize(craft, seed=2, dtype="float64")  # other weights: all come from disk
        tx = make_optax(lr)
        restored = tm.to(jm, anchor, optimizer=tx.init(jm.params), frozen=True)
        assert list(restored) == [] and restored.step == before
        jax_steps(jm, tx, restored.optimizer, after)
    expected, got = canonical(module), jax_values(jm)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-8, atol=1e-10, err_msg=key)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_stopped_under_jax_resumed_under_torch_equals_continuing_under_jax(tmp_path, name):
    make_torch, make_optax = OPTIMIZERS[name]
    tm = TimeMachine(save_path=tmp_path)
    with jax.enable_x64(True):
        craft = MLP()
        jm = jcraft.realize(craft, seed=3, dtype="float64")
        tx = make_optax(0.02)
        opt_state = jax_steps(jm, tx, tx.init(jm.params), 2)
        anchor = tm.drop(jm, optimizer=opt_state, step=2)
        jax_steps(jm, tx, opt_state, 2)
    module = tcraft.realize(craft, seed=4, dtype="float64")
    optimizer = make_torch(module.parameters(), 0.02)
    tm.to(module, anchor, optimizer=optimizer, frozen=True)
    torch_steps(module, optimizer, 2)
    expected, got = jax_values(jm), canonical(module)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-8, atol=1e-10, err_msg=key)


def test_weights_cross_exactly_and_give_equal_outputs(tmp_path):
    craft = MLP()
    module = tcraft.realize(craft, seed=5)
    torch_steps(module, torch.optim.SGD(module.parameters(), 0.1), 2)  # move off the init
    anchor = TimeMachine(save_path=tmp_path).drop(module)
    jm = jcraft.realize(craft, seed=6)
    TimeMachine(ckpt_path=tmp_path).to(jm, frozen=True)  # the newest anchor in the folder
    for key, value in canonical(module).items():
        np.testing.assert_array_equal(jax_values(jm)[key], value)
    module.eval()
    x = DATA[0].astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(jm(jnp.asarray(x))),
        module(torch.from_numpy(x)).detach().numpy(),
        rtol=2e-5,
        atol=1e-6,
    )
    back = tcraft.realize(craft, seed=7)
    TimeMachine().to(back, anchor, frozen=True)
    for key, value in canonical(module).items():
        np.testing.assert_array_equal(canonical(back)[key], value)


def test_frozen_refuses_and_names_every_mismatch(tmp_path):
    anchor = TimeMachine().drop(tcraft.realize(MLP(hidden=16)), tmp_path / "a")
    other = tcraft.realize(MLP(hidden=12))
    with pytest.raises(
        CheckpointError, match=r"fc1\.weight is \(16, 8\) on disk but \(12, 8\) in the model"
    ):
        TimeMachine().to(other, anchor, frozen=True)
    skipped = TimeMachine().to(other, anchor)
    assert "fc2.bias" not in skipped and "fc1.weight" in skipped
    assert np.array_equal(
        canonical(other)["fc2.bias"], canonical(tcraft.realize(MLP(16)))["fc2.bias"]
    )


def test_scopes_select_by_name_prefix(tmp_path):
    module = tcraft.realize(MLP(), seed=8)
    anchor = TimeMachine().drop(module, tmp_path / "fc1", save_scope="fc1")
    manifest = dualtrain.checkpoint.manifest.read_manifest(anchor)
    assert sorted(manifest["names"]) == ["fc1.bias", "fc1.weight"]
    jm = jcraft.realize(MLP(), seed=9)
    skipped = TimeMachine().to(jm, anchor, ckpt_scope="fc1", frozen=True)
    assert list(skipped) == []
    assert np.array_equal(np.asarray(jm.params["fc1.weight"]), canonical(module)["fc1.weight"])
    with pytest.raises(
        CheckpointError, match=r"fc2\.weight is in the model but not in fc1\.safetensors"
    ):
        TimeMachine().to(jm, anchor, frozen=True)


def test_retention_counts_anchors_on_disk_across_restarts(tmp_path):
    module = tcraft.realize(MLP())
    for _ in range(3):
        TimeMachine(save_path=tmp_path, max_anchors=2).drop(module)  # a new process each time
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MLP-2.safetensors", "MLP-3.safetensors"]
    tm = TimeMachine(save_path=tmp_path, max_anchors=2)
    assert tm.drop(module).name == "MLP-4.safetensors"
    assert len(list(tmp_path.iterdir())) == 2
    # A file you name is yours: it is neither counted nor pruned, and prunes nothing.
    # A name of the numbered form is drop's own: refused (retention would delete it).
    tm.drop(module, "MLP-final")
    with pytest.raises(ArgumentError, match="numbered-anchor form"):
        tm.drop(module, "MLP-99")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["MLP-3.safetensors", "MLP-4.safetensors", "MLP-final.safetensors"]


def test_tied_weights_are_stored_once(tmp_path):
    class Tied(Craft):
        def __init__(self):
            super().__init__("T")
            self.fc = dock.Dense(4, 4)
            self.again = self.fc

        def run(self, x):
            return self.again(self.fc(x))

    module = tcraft.realize(Tied())
    manifest = dualtrain.checkpoint.manifest.read_manifest(
        TimeMachine().drop(module, tmp_path / "t")
    )
    assert sorted(manifest["names"]) == ["fc.bias", "fc.weight"]


def test_failed_drops_write_nothing(tmp_path):
    module = tcraft.realize(MLP())
    with pytest.raises(ValueError, match="extra must be JSON-serializable"):
        TimeMachine(save_path=tmp_path).drop(module, extra={"when": object()})
    assert list(tmp_path.iterdir()) == []


def test_anchors_are_plain_safetensors_with_a_json_manifest(tmp_path):
    module = tcraft.realize(MLP())
    anchor = TimeMachine().drop(module, tmp_path / "x", step=7, extra={"epoch": 2})
    raw = anchor.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    manifest = json.loads(header["__metadata__"]["dualtrain"])
    assert (
        manifest["backend"] == "torch"
        and manifest["step"] == 7
        and manifest["extra"] == {"epoch": 2}
    )
    assert manifest["names"]["fc1.weight"] == {"shape": [16, 8], "dtype": "float32"}
    assert header["fc1.weight"]["shape"] == [16, 8]  # the canonical (out, in)


def test_foreign_and_missing_files_are_refused(tmp_path):
    import safetensors.numpy

    plain = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file({"w": np.ones(2)}, str(plain))
    module = tcraft.realize(MLP())
    with pytest.raises(CheckpointError, match="not a dualtrain checkpoint"):
        TimeMachine().to(module, plain)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        TimeMachine().to(module, tmp_path / "nope.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a file format")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        TimeMachine().to(module, tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match="max_anchors must be a positive int, or -1"):
        TimeMachine(max_anchors=0)


def test_torch_rng_state_is_restored_on_request(tmp_path):
    module = tcraft.realize(MLP())
    torch.manual_seed(123)
    anchor = TimeMachine().drop(module, tmp_path / "r")
    expected = torch.rand(3)
    torch.manual_seed(999)
    TimeMachine().to(module, anchor, restore_rng=True)
    assert torch.equal(torch.rand(3), expected)


def test_bfloat16_models_cross_as_bfloat16(tmp_path):
    module = tcraft.realize(MLP(), seed=10, dtype="bfloat16")
    anchor = TimeMachine().drop(module, tmp_path / "bf16")
    manifest = dualtrain.checkpoint.manifest.read_manifest(anchor)
    assert manifest["names"]["fc1.weight"]["dtype"] == "bfloat16"
    jm = jcraft.realize(MLP(), seed=11, dtype="bfloat16")
    TimeMachine().to(jm, anchor, frozen=True)
    assert jm.params["fc1.weight"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(jm.params["fc1.weight"]).astype(np.float32),
        module.fc1.weight.detach().float().numpy(),
    )
