"""TimeMachine and BatchModule members: drop one or all, load them back, refusals.

A member's anchor is exactly the anchor of ``bm.extract(i)``; sets are written whole or
not at all; member series have their own numbering and retention; every refusal writes
nothing and changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402
from dualtrain.checkpoint import TimeMachine  # noqa: E402
from dualtrain.errors import ArgumentError, CheckpointError  # noqa: E402
from dualtrain_jax import batching as jax_batching  # noqa: E402
from dualtrain_torch import batching as torch_batching  # noqa: E402
from tests.checkpoint.crafts import Net  # noqa: E402

FRAMEWORKS = ("torch", "jax")


def _batch(framework: str, n: int = 3, seed: int = 1, hidden: int = 16):
    if framework == "torch":
        module = dualtrain_torch.realize(Net(hidden=hidden))
        return torch_batching.BatchModule(module, n, seed=seed, check_isolation=False)
    module = dualtrain_jax.realize(Net(hidden=hidden))
    return jax_batching.BatchModule(module, n, seed=seed, check_isolation=False)


def _values(bm) -> dict[str, np.ndarray]:
    """Every stacked tensor of a BatchModule, copied to NumPy."""
    if isinstance(bm, torch.nn.Module):
        return {k: v.detach().numpy().copy() for k, v in bm.state_dict().items()}
    return {k: np.array(v) for k, v in {**bm.params, **bm.state}.items()}


def _member_values(bm, i: int) -> dict[str, np.ndarray]:
    one = bm.extract(i)
    if isinstance(one, torch.nn.Module):
        return {k: v.detach().numpy().copy() for k, v in one.state_dict().items()}
    return {k: np.array(v) for k, v in {**one.params, **one.state}.items()}


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    for name in set(a) & set(b):  # JAX keeps no num_batches_tracked
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _files(folder: Path) -> list[str]:
    return sorted(os.listdir(folder)) if folder.exists() else []


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("member", [0, 2, -1])
def test_a_dropped_member_is_the_anchor_of_the_extracted_member(tmp_path, framework, member):
    bm = _batch(framework)
    tm = TimeMachine(save_path=tmp_path)
    path = tm.drop(bm, "member", member=member, step=7, extra={"lr": 0.1})
    reference = tm.drop(bm.extract(member), "extracted", step=7, extra={"lr": 0.1})
    assert path.read_bytes() == reference.read_bytes()  # byte for byte, RNG state included


@pytest.mark.parametrize("writer", FRAMEWORKS)
@pytest.mark.parametrize("reader", FRAMEWORKS)
def test_all_members_round_trip_between_batch_modules(tmp_path, writer, reader):
    source, target = _batch(writer, seed=1), _batch(reader, seed=2)
    tm = TimeMachine(save_path=tmp_path)
    paths = tm.drop_members(source, step=3)
    assert [p.name for p in paths] == [f"Net%m{i}-1.safetensors" for i in range(3)]
    restored = tm.to_members(target)  # the newest whole set in save_path
    assert [r.step for r in restored] == [3, 3, 3]
    assert [r.file for r in restored] == paths
    for i in range(3):
        _assert_same(_member_values(target, i), _member_values(source, i))
    # Each member's anchor is also an ordinary single model's.
    single = (dualtrain_torch if reader == "torch" else dualtrain_jax).realize(Net())
    tm.to(single, paths[2], frozen=True)
    if reader == "torch":
        loaded = {k: v.detach().numpy() for k, v in single.state_dict().items()}
    else:
        loaded = {k: np.asarray(v) for k, v in {**single.params, **single.state}.items()}
    _assert_same(loaded, _member_values(source, 2))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_one_member_loads_from_any_craft_anchor_and_the_others_stay(tmp_path, framework):
    bm = _batch(framework, seed=4)
    other = "jax" if framework == "torch" else "torch"
    single = (dualtrain_torch if other == "torch" else dualtrain_jax).realize(Net(), seed=9)
    tm = TimeMachine(save_path=tmp_path)
    anchor = tm.drop(single, "single")
    before = [_member_values(bm, i) for i in range(3)]
    tm.to(bm, anchor, member=-2)
    if other == "torch":
        expected = {k: v.detach().numpy() for k, v in single.state_dict().items()}
    else:
        expected = {k: np.asarray(v) for k, v in {**single.params, **single.state}.items()}
    _assert_same(_member_values(bm, 1), expected)
    _assert_same(_member_values(bm, 0), before[0])
    _assert_same(_member_values(bm, 2), before[2])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_member_series_number_and_retain_on_their_own(tmp_path, framework):
    bm = _batch(framework)
    tm = TimeMachine(save_path=tmp_path, max_anchors=2)
    tm.drop(bm.extract(0))  # the scope's own series: Net-1
    for step in range(3):
        tm.drop(bm, member=1, step=step)
    for step in range(3, 6):
        tm.drop_members(bm, step=step)
    # member 1's series: 1, 2, 3 alone, then sets 4, 5, 6 (one number past every series);
    # two kept per series; the scope's own anchor is no member's and is never deleted.
    assert _files(tmp_path) == sorted(
        ["Net-1.safetensors"] + [f"Net%m{i}-{n}.safetensors" for i in range(3) for n in (5, 6)]
    )
    target = _batch(framework, seed=5)
    assert tm.to(target, member=1).step == 5  # the newest of member 1's series
    assert tm.to(bm.extract(0)).file.name == "Net-1.safetensors"  # never a member's
    # A set that lost a member is passed over for the newest whole one.
    (tmp_path / "Net%m2-6.safetensors").unlink()
    assert [r.step for r in tm.to_members(target)] == [4, 4, 4]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_named_sets_and_lists_of_paths(tmp_path, framework):
    bm, target = _batch(framework, seed=1), _batch(framework, seed=2)
    tm = TimeMachine(save_path=tmp_path)
    paths = tm.drop_members(bm, "runs/best")
    assert paths == [tmp_path / f"runs/best%m{i}.safetensors" for i in range(3)]
    tm.drop_members(target, "runs/best")  # a named set replaces the older one
    tm.to_members(bm, "runs/best")
    for i in range(3):
        _assert_same(_member_values(bm, i), _member_values(target, i))
    tm.to_members(target, [paths[2], paths[1], paths[0]])  # any anchors, in member order
    _assert_same(_member_values(target, 0), _member_values(bm, 2))


def test_a_taken_number_moves_the_whole_set_and_leaves_nothing_behind(tmp_path):
    bm = _batch("torch")
    (tmp_path / "Net%m2-1.safetensors").mkdir()  # member 2's name at n=1 is not free
    tm = TimeMachine(save_path=tmp_path)
    paths = tm.drop_members(bm)
    assert [p.name for p in paths] == [f"Net%m{i}-2.safetensors" for i in range(3)]
    # Members 0 and 1 were renamed at n=1 before member 2 failed: they were taken back.
    assert _files(tmp_path) == sorted(["Net%m2-1.safetensors", *(p.name for p in paths)])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_member_that_does_not_fit_changes_nothing(tmp_path, framework):
    tm = TimeMachine(save_path=tmp_path)
    small = _batch(framework, hidden=8)
    anchor = tm.drop(small, "small", member=0)
    bm = _batch(framework)
    before = _values(bm)
    with pytest.raises(CheckpointError, match=r"fc1.weight is \(8, 3\) on disk but \(16, 3\)"):
        tm.to(bm, anchor, member=1)
    _assert_same(_values(bm), before)
    # to_members checks every member before any changes: the third anchor does not fit.
    good = tm.drop_members(_batch(framework, seed=8), "good")
    with pytest.raises(CheckpointError, match="frozen load refused"):
        tm.to_members(bm, [good[0], good[1], anchor])
    _assert_same(_values(bm), before)
    # frozen=False loads what fits into the member, as `to` does for a model.
    skipped = tm.to(bm, anchor, member=1, frozen=False)
    assert "fc1.weight" in skipped and "fc2.bias" not in skipped


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bad_member_arguments_write_and_change_nothing(tmp_path, framework):
    bm = _batch(framework)
    single = bm.extract(0)
    tm = TimeMachine(save_path=tmp_path)
    anchor = TimeMachine(save_path=tmp_path / "other").drop(single, "one")
    before = _values(bm)
    cases = [
        (lambda: tm.drop(bm, member=3), r"member must be an int in \[-3, 2\]; got member=3"),
        (lambda: tm.drop(bm, member=True), "member must be an int"),
        (lambda: tm.drop(bm), "member must be the index of one of the BatchModule's 3 members"),
        (lambda: tm.drop(single, member=0), "member must be None for a single model"),
        (lambda: tm.to(bm, anchor), r"or to_members\(bm\) for all of them"),
        (lambda: tm.to(bm, anchor, member=-4), "member must be an int in"),
        (lambda: tm.to(single, anchor, member=0), "member must be None for a single model"),
        (lambda: tm.drop_members(single), "bm must be a BatchModule"),
        (lambda: tm.to_members(single), "bm must be a BatchModule"),
        (lambda: tm.to_members(bm, [anchor, anchor]), "one anchor per member"),
        (lambda: tm.drop_members(bm, "x" * 250), "at most 255 bytes"),
        (lambda: tm.drop_members(bm, "MLP-3"), "numbered-anchor form"),
        (lambda: tm.drop_members(bm, save_scope="nothing"), "save_scope must be"),
        (lambda: tm.drop_members(bm, extra={"f": print}), "JSON-serializable"),
    ]
    if framework == "torch":
        opt = torch.optim.SGD(bm.parameters(), 0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1)
        cases += [
            (lambda: tm.drop(bm, member=0, optimizer=opt), "optimizer must be None with member="),
            (lambda: tm.drop(bm, member=0, scheduler=sched), "scheduler must be None with"),
            (lambda: tm.to(bm, anchor, member=0, optimizer=opt), "optimizer must be None"),
        ]
    else:
        import optax

        state = optax.sgd(0.1).init(bm.params)
        cases += [
            (lambda: tm.drop(bm, member=0, optimizer=state), "optimizer must be None with"),
            (lambda: tm.to(bm, anchor, member=0, optimizer=state), "optimizer must be None"),
        ]
    for call, message in cases:
        with pytest.raises(ArgumentError, match=message):
            call()
        assert _files(tmp_path) == ["other"], message
        _assert_same(_values(bm), before)
    (tmp_path / "named%m1.safetensors").mkdir()  # a folder where member 1's file goes
    with pytest.raises(ArgumentError, match="where no folder is"):
        tm.drop_members(bm, "named")
    assert _files(tmp_path) == ["named%m1.safetensors", "other"]


def test_members_that_are_not_crafts_are_refused_by_name(tmp_path):
    tm = TimeMachine(save_path=tmp_path)
    plain = torch_batching.BatchModule(torch.nn.Linear(2, 3), 2, check_isolation=False)
    with pytest.raises(ArgumentError, match=r"plain Linear modules: save bm.extract\(i\)"):
        tm.drop(plain, member=0)
    with pytest.raises(ArgumentError, match="plain Linear modules"):
        tm.drop_members(plain)
    with pytest.raises(ArgumentError, match="plain Linear modules"):
        tm.to(plain, "x", member=0)
    pair = jax_batching.BatchModule(
        ({"w": np.ones(3, np.float32)}, lambda p, x: p["w"] * x), 2, init="identical"
    )
    with pytest.raises(ArgumentError, match=r"\(params, apply_fn\) pairs"):
        tm.drop_members(pair)
    assert _files(tmp_path) == []


def test_no_set_and_no_member_anchor_are_checkpoint_errors(tmp_path):
    bm = _batch("jax")
    tm = TimeMachine(save_path=tmp_path)
    with pytest.raises(CheckpointError, match="no anchor of member 1 of scope 'Net'"):
        tm.to(bm, member=1)
    with pytest.raises(CheckpointError, match="no whole set of 3 member anchors"):
        tm.to_members(bm)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        tm.to_members(bm, "missing")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_damaged_member_anchor_changes_no_member(tmp_path, framework):
    tm = TimeMachine(save_path=tmp_path)
    paths = tm.drop_members(_batch(framework, seed=3))
    data = bytearray(paths[2].read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the last tensor's bytes: its CRC-32 no longer holds
    paths[2].write_bytes(bytes(data))
    bm = _batch(framework)
    before = _values(bm)
    with pytest.raises(CheckpointError, match=r"Net%m2-1\.safetensors"):
        tm.to_members(bm)
    with pytest.raises(CheckpointError, match=r"Net%m2-1\.safetensors"):
        tm.to(bm, member=2)
    _assert_same(_values(bm), before)


def test_a_set_that_fails_midway_leaves_no_file(tmp_path):
    """Members 0 and 1 are written (to temporary files) before member 2 fails: none stays."""

    class Failing(torch_batching.BatchModule):
        """A BatchModule whose member 2 cannot be read, as a disk or device error would."""

        def extract(self, index):
            if index == 2:
                raise RuntimeError("member 2 is unreadable")
            return super().extract(index)

    bm = Failing(dualtrain_torch.realize(Net()), 4, check_isolation=False)
    tm = TimeMachine(save_path=tmp_path)
    for file in ("", "named"):
        with pytest.raises(RuntimeError, match="member 2 is unreadable"):
            tm.drop_members(bm, file)
        assert _files(tmp_path) == []  # no anchor and no temporary file


def test_a_name_of_the_member_form_is_refused_so_no_set_can_delete_it(tmp_path):
    # drop_members deletes a replaced set's extra members; a file the user named in that
    # form would be among them, so drop refuses the form, as it refuses numbered names.
    from dualtrain.checkpoint import TimeMachine
    from dualtrain.demo.run import DemoNet
    from dualtrain.errors import ArgumentError

    torch_part = pytest.importorskip("dualtrain_torch")
    tm = TimeMachine(save_path=tmp_path, ckpt_path=tmp_path)
    net = torch_part.realize(DemoNet())
    for name in ("best%m5", "runs/best%m0.safetensors"):
        with pytest.raises(ArgumentError, match="member form"):
            tm.drop(net, name)
    assert not any(tmp_path.rglob("*.safetensors"))
    assert tm.drop(net, "best%mx").name == "best%mx.safetensors"  # not the form: a name


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_relative_save_path_finds_its_newest_set(tmp_path, monkeypatch, framework):
    """`to_members` with no file reads the newest set of a relative save_path (it looked
    for save_path/save_path/<member> and found nothing)."""
    monkeypatch.chdir(tmp_path)
    source, target = _batch(framework, seed=1), _batch(framework, seed=2)
    tm = TimeMachine(save_path="ckpt")
    tm.drop_members(source, step=4)
    assert [r.step for r in tm.to_members(target)] == [4, 4, 4]
    _assert_same(_values(target), _values(source))
    assert [r.step for r in TimeMachine(ckpt_path="ckpt").to_members(target)] == [4, 4, 4]
