"""Issue 11 item 3 (and 17): `to` checks everything before it changes anything."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings, strategies as st

from dualtrain import CheckpointError, TimeMachine
from dualtrain.checkpoint.anchor_file import write_anchor
from dualtrain.errors import ArgumentError, ShapeError
from tests.checkpoint.crafts import Net, assert_same, jax_values, torch_values, train_torch

torch = pytest.importorskip("torch")
tcraft = pytest.importorskip("dualtrain_torch.craft")
jcraft = pytest.importorskip("dualtrain_jax.craft")


def header_and_data(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def rewrite(src, dst, change_tensors=None, change_manifest=None):
    """A copy of anchor `src` at `dst` with tensors and/or manifest changed (CRCs recomputed)."""
    with safetensors.safe_open(str(src), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no __iter__)
        manifest = json.loads(f.metadata()["dualtrain"])
    if change_tensors:
        change_tensors(tensors)
    if change_manifest:
        change_manifest(manifest)
    manifest.pop("crc32c", None)  # recomputed: the change is what the test is about
    write_anchor(dst, tensors, manifest)
    return dst


@pytest.fixture
def anchor(tmp_path):
    module = tcraft.realize(Net(), seed=1)
    train_torch(module)
    return TimeMachine(save_path=tmp_path).drop(module, "good")


def test_a_stored_1_never_broadcasts_into_16(tmp_path, anchor):
    """The manifest says (16,) but the tensor stored is (1,): today copy_ broadcast it."""

    def shrink(t):
        t["fc1.bias"] = t["fc1.bias"][:1]

    bad = rewrite(anchor, tmp_path / "bad.safetensors", shrink)
    for frozen in (False, True):
        for realize, values in ((tcraft.realize, torch_values), (jcraft.realize, jax_values)):
            module = realize(Net(), seed=5)
            before = values(module)
            with pytest.raises(CheckpointError, match=r"'fc1\.bias' is \(1,\) float32 in the"):
                TimeMachine().to(module, bad, frozen=frozen)
            assert_same(values(module), before)


def test_a_stored_1_with_a_manifest_saying_1_is_skipped_not_broadcast(tmp_path, anchor):
    def shrink(t):
        t["fc1.bias"] = t["fc1.bias"][:1]

    def say(m):
        m["names"]["fc1.bias"]["shape"] = [1]
        m.pop("crc32c")

    bad = rewrite(anchor, tmp_path / "bad.safetensors", shrink, say)
    module = tcraft.realize(Net(), seed=5)
    bias = module.fc1.bias.detach().clone()
    assert "fc1.bias" in TimeMachine().to(module, bad)
    assert torch.equal(module.fc1.bias, bias)
    with pytest.raises(CheckpointError, match=r"fc1\.bias is \(1,\) on disk but \(16,\)"):
        TimeMachine().to(module, bad, frozen=True)


def test_the_adapters_refuse_a_shape_they_would_broadcast():
    from dualtrain_jax.checkpoint import import_tensors

    module = tcraft.realize(Net())
    with pytest.raises(ShapeError, match=r"fc1\.bias is \(1,\) in the values given but \(16,\)"):
        tcraft.load_canonical(module, {"fc1.bias": np.ones(1, np.float32)})
    jm = jcraft.realize(Net())
    before = jax_values(jm)
    with pytest.raises(CheckpointError, match=r"fc1\.bias is \(1,\) in the checkpoint"):
        import_tensors(jm, {"fc2.bias": np.ones(2, np.float32), "fc1.bias": np.ones(1)})
    assert_same(jax_values(jm), before)


def test_dtypes_cast_within_their_kind_never_across(tmp_path, anchor):
    def to_int(t):
        t["fc1.weight"] = t["fc1.weight"].astype(np.int32)

    def say(m):
        m["names"]["fc1.weight"]["dtype"] = "int32"
        m.pop("crc32c")

    bad = rewrite(anchor, tmp_path / "int.safetensors", to_int, say)
    module = tcraft.realize(Net(), seed=5)
    weight = module.fc1.weight.detach().clone()
    assert list(TimeMachine().to(module, bad)) == ["fc1.weight"]
    assert torch.equal(module.fc1.weight, weight)
    with pytest.raises(CheckpointError, match=r"fc1\.weight is int32 on disk but float32"):
        TimeMachine().to(module, bad, frozen=True)
    half = tcraft.realize(Net(), seed=6, dtype="float64")  # float -> float casts, as documented
    assert list(TimeMachine().to(half, anchor, frozen=True)) == []


def test_a_damaged_file_leaves_model_and_optimizer_as_they_were(tmp_path, anchor):
    module = tcraft.realize(Net(), seed=5)
    opt = torch.optim.SGD(module.parameters(), 0.1, momentum=0.9)
    train_torch(module)  # fills momentum buffers
    opt.zero_grad()
    module(torch.ones(4, 3)).sum().backward()
    opt.step()
    before = torch_values(module)
    state = {k: v["momentum_buffer"].clone() for k, v in opt.state.items()}
    raw = bytearray(anchor.read_bytes())
    raw[-3] ^= 0xFF  # the last tensor's data
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(raw)
    with pytest.raises(CheckpointError, match="fails its CRC-32C check"):
        TimeMachine().to(module, bad)
    assert_same(torch_values(module), before)
    assert all(torch.equal(opt.state[p]["momentum_buffer"], v) for p, v in state.items())


def test_batchnorm_batch_counts_are_saved_and_restored(tmp_path):
    module = tcraft.realize(Net(), seed=1)
    train_torch(module, steps=3)
    assert int(module.bn.num_batches_tracked) == 3
    anchor = TimeMachine(save_path=tmp_path).drop(module, "bn")
    back = tcraft.realize(Net(), seed=2)
    assert list(TimeMachine().to(back, anchor, frozen=True)) == []
    assert int(back.bn.num_batches_tracked) == 3
    # JAX keeps no count: a torch anchor loads frozen into JAX, and back, count left as is.
    jm = jcraft.realize(Net(), seed=3)
    assert list(TimeMachine().to(jm, anchor, frozen=True)) == []
    janchor = TimeMachine(save_path=tmp_path).drop(jm, "jax")
    assert list(TimeMachine().to(back, janchor, frozen=True)) == []
    assert int(back.bn.num_batches_tracked) == 3


def flip(raw: bytes, at: int, by: int) -> bytes:
    out = bytearray(raw)
    out[at] ^= by
    return bytes(out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("law")
    module = tcraft.realize(Net(hidden=4), seed=1)
    train_torch(module)
    path = TimeMachine().drop(module, folder / "law")
    return path.read_bytes(), torch_values(module), folder


@settings(max_examples=60)
@given(data=st.data(), truncate=st.booleans(), frozen=st.booleans())
def test_a_corrupted_anchor_never_changes_the_model(saved, data, truncate, frozen):
    """Law: flip or truncate any byte; `to` loads the saved values or changes nothing."""
    raw, expected, folder = saved
    at = data.draw(st.integers(0, len(raw) - 1), label="at")
    if truncate:
        bad = raw[:at]
    else:
        bad = flip(raw, at, data.draw(st.integers(1, 255), label="xor"))
    path = folder / "bad.safetensors"
    path.write_bytes(bad)
    module = tcraft.realize(Net(hidden=4), seed=7)
    before = torch_values(module)
    try:
        TimeMachine().to(module, path, frozen=frozen)
    except CheckpointError:
        assert_same(torch_values(module), before)
    else:
        assert_same(torch_values(module), expected)


@settings(max_examples=20)
@given(data=st.data())
def test_a_corrupted_anchor_never_changes_a_jax_model(saved, data):
    raw, expected, folder = saved
    path = folder / "jbad.safetensors"
    path.write_bytes(
        flip(raw, data.draw(st.integers(0, len(raw) - 1)), data.draw(st.integers(1, 255)))
    )
    jm = jcraft.realize(Net(hidden=4), seed=7)
    before = jax_values(jm)
    try:
        TimeMachine().to(jm, path)
    except CheckpointError:
        assert_same(jax_values(jm), before)
    else:
        got = jax_values(jm)
        for k, v in got.items():
            np.testing.assert_array_equal(v, expected[k], err_msg=k)


# ---- item 17: malformed files are CheckpointErrors naming the file ----------------------


def manifest_of(path):
    with safetensors.safe_open(str(path), framework="numpy") as f:
        return json.loads(f.metadata()["dualtrain"])


BAD_MANIFESTS = {
    "not json": lambda m: "{not json",
    "a list": lambda m: "[]",
    "no names": lambda m: json.dumps({k: v for k, v in m.items() if k != "names"}),
    "names a list": lambda m: json.dumps({**m, "names": []}),
    "tensors wrong": lambda m: json.dumps({**m, "tensors": ["x"]}),
    "negative shape": lambda m: json.dumps(
        {**m, "names": {**m["names"], "fc1.bias": {"shape": [-16], "dtype": "float32"}}}
    ),
    "huge shape": lambda m: json.dumps(
        {**m, "names": {**m["names"], "fc1.bias": {"shape": [2**62], "dtype": "float32"}}}
    ),
    "step a string": lambda m: json.dumps({**m, "step": "3"}),
    "extra a list": lambda m: json.dumps({**m, "extra": []}),
    "crc32c a list": lambda m: json.dumps({**m, "crc32c": [1, 2]}),
    "crc32c negative": lambda m: json.dumps(
        {**m, "crc32c": {k: [-1] * len(v) for k, v in m["crc32c"].items()}}
    ),
    "crc32c a chunk short": lambda m: json.dumps(
        {**m, "crc32c": {k: v[:-1] for k, v in m["crc32c"].items()}}
    ),
    "crc32c a number": lambda m: json.dumps({**m, "crc32c": dict.fromkeys(m["crc32c"], 5)}),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_malformed_manifests_are_checkpoint_errors_naming_the_file(tmp_path, anchor, case):
    with safetensors.safe_open(str(anchor), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no __iter__)
    bad = tmp_path / "bad.safetensors"
    text = BAD_MANIFESTS[case](manifest_of(anchor))
    safetensors.numpy.save_file(tensors, str(bad), metadata={"dualtrain": text})
    module = tcraft.realize(Net(), seed=5)
    before = torch_values(module)
    with pytest.raises(CheckpointError, match=str(bad)):
        TimeMachine().to(module, bad)
    assert_same(torch_values(module), before)


def raw_file(header: dict, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


BAD_FILES = {
    "empty": b"",
    "short": b"\x01\x02",
    "huge header length": struct.pack("<Q", 2**62) + b"{}",
    "header not json": struct.pack("<Q", 3) + b"{x}",
    "header a list": raw_file([]),  # type: ignore[arg-type]
    "unknown dtype": raw_file(
        {"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, b"0" * 4
    ),
    "negative offset": raw_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}),
    "bool shape": raw_file(
        {"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"0" * 4
    ),
    "too few bytes": raw_file(
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"0" * 4
    ),
    "truncated": raw_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"0" * 4),
    "gap": raw_file(
        {
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
        },
        b"0" * 12,
    ),
    "metadata not strings": raw_file({"__metadata__": {"dualtrain": 3}}),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_malformed_files_are_checkpoint_errors_naming_the_file(tmp_path, case):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(BAD_FILES[case])
    with pytest.raises(CheckpointError, match=str(bad)):
        TimeMachine().to(tcraft.realize(Net()), bad)


def test_max_anchors_refuses_bools():
    from dualtrain import ArgumentError

    for value in (True, False, 1.0, "2"):
        with pytest.raises(ArgumentError, match="max_anchors must be a positive int"):
            TimeMachine(max_anchors=value)


def test_anchors_carry_a_crc_per_tensor(tmp_path, anchor):
    header, _ = header_and_data(anchor)
    manifest = json.loads(header["__metadata__"]["dualtrain"])
    assert sorted(manifest["crc32c"]) == sorted(k for k in header if k != "__metadata__")


def test_write_anchor_keeps_zero_d_arrays_zero_d(tmp_path):
    write_anchor(tmp_path / "z.safetensors", {"s": np.array(3, np.int64)}, {"format": "x"})
    header, _ = header_and_data(tmp_path / "z.safetensors")
    assert header["s"]["shape"] == []


# ---- adversarial review: the header and manifest carry a CRC-32 too --------------------


def _optimizer_state(opt):
    sd = opt.state_dict()
    return json.dumps(
        {
            "groups": sd["param_groups"],
            "state": {
                str(k): {kk: np.asarray(vv).tolist() for kk, vv in s.items()}
                for k, s in sd["state"].items()
            },
        },
        default=str,
    )


def _trained_with_optimizer(seed, lr):
    module = tcraft.realize(Net(hidden=4), seed=seed)
    opt = torch.optim.Adam(module.parameters(), lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    module.train()
    for _ in range(2):
        opt.zero_grad()
        module(torch.from_numpy(np.ones((4, 3), np.float32))).square().mean().backward()
        opt.step()
        sched.step()
    return module, opt, sched


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    folder = tmp_path_factory.mktemp("full")
    module, opt, sched = _trained_with_optimizer(1, 1e-2)
    path = TimeMachine().drop(module, folder / "full", optimizer=opt, scheduler=sched, step=5)
    state = torch_values(module), _optimizer_state(opt), json.dumps(sched.state_dict())
    return path.read_bytes(), state, folder


@settings(max_examples=40)
@given(data=st.data())
def test_one_flipped_bit_anywhere_loads_the_same_state_or_changes_nothing(full, data):
    """Law: flip one bit (header and manifest included): `to` restores exactly the model,
    optimizer, scheduler and step saved, or raises CheckpointError with nothing changed."""
    raw, (values, opt_state, sched_state), folder = full
    header_end = 8 + int.from_bytes(raw[:8], "little")
    in_header = data.draw(st.booleans(), label="in header")
    at = data.draw(st.integers(0, header_end - 1) if in_header else st.integers(0, len(raw) - 1))
    path = folder / "flipped.safetensors"
    path.write_bytes(flip(raw, at, 1 << data.draw(st.integers(0, 7), label="bit")))
    module, opt, sched = _trained_with_optimizer(7, 1e-3)
    before = torch_values(module), _optimizer_state(opt), json.dumps(sched.state_dict())
    try:
        restored = TimeMachine().to(module, path, optimizer=opt, scheduler=sched)
    except CheckpointError:
        after = torch_values(module), _optimizer_state(opt), json.dumps(sched.state_dict())
        assert_same(after[0], before[0])
        assert after[1:] == before[1:]
    else:
        assert_same(torch_values(module), values)
        assert _optimizer_state(opt) == opt_state
        assert json.dumps(sched.state_dict()) == sched_state
        assert restored.step == 5


def test_an_anchor_of_this_format_without_its_crcs_is_refused(tmp_path, anchor):
    """Renaming the CRC keys must not turn the checks off; the old format loads without."""
    with safetensors.safe_open(str(anchor), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no __iter__)
        manifest = json.loads(f.metadata()["dualtrain"])
    module = tcraft.realize(Net(), seed=5)
    bare = tmp_path / "bare.safetensors"
    safetensors.numpy.save_file(tensors, str(bare), metadata={"dualtrain": json.dumps(manifest)})
    with pytest.raises(CheckpointError, match="but its header's CRC-32"):
        TimeMachine().to(module, bare)
    old = {**manifest, "format": "dualtrain-checkpoint/1"}
    old.pop("crc32c")
    safetensors.numpy.save_file(tensors, str(bare), metadata={"dualtrain": json.dumps(old)})
    assert list(TimeMachine().to(module, bare, frozen=True)) == []
    np.testing.assert_array_equal(torch_values(module)["fc1.bias"], tensors["fc1.bias"])


# ---- adversarial review: a scope that matches nothing is refused -------------------------


@pytest.mark.parametrize("scope", ["fc", "", "fc1.", "FC1", "nonexistent"])
def test_a_scope_matching_nothing_is_refused_naming_it(tmp_path, anchor, scope):
    module = tcraft.realize(Net(), seed=5)
    with pytest.raises(ArgumentError, match=rf"save_scope must be .*'bn\.bias'.*{scope!r}"):
        TimeMachine(save_path=tmp_path).drop(module, "s", save_scope=scope)
    assert not (tmp_path / "s.safetensors").exists()
    before = torch_values(module)
    for frozen in (True, False):
        with pytest.raises(CheckpointError, match=rf"ckpt_scope {scope!r} matches no .*'bn\.bias'"):
            TimeMachine().to(module, anchor, ckpt_scope=scope, frozen=frozen)
    assert_same(torch_values(module), before)
