"""Issue 11 item 2: `to` loads the newest anchor of the Craft's own scope, by number."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import CheckpointError, TimeMachine
from dualtrain.checkpoint.anchor_names import anchor_stem
from tests.checkpoint.crafts import Net

tcraft = pytest.importorskip("dualtrain_torch.craft")
jcraft = pytest.importorskip("dualtrain_jax.craft")


def test_newest_is_by_number_not_by_file_time(tmp_path):
    module = tcraft.realize(Net("GEN"))
    tm = TimeMachine(save_path=tmp_path)
    for step in (1, 2, 3):
        tm.drop(module, step=step)
    os.utime(tmp_path / "GEN-1.safetensors", (4e9, 4e9))  # touched last (a copy, a restore)
    assert TimeMachine(ckpt_path=tmp_path).to(module).step == 3


def test_models_sharing_a_folder_never_load_each_others_anchors(tmp_path):
    gen, disc = tcraft.realize(Net("GEN")), tcraft.realize(Net("DISC", hidden=4))
    tm = TimeMachine(save_path=tmp_path)
    tm.drop(gen, step=1)
    tm.drop(gen, step=2)
    tm.drop(disc, step=10)  # the newest file in the folder is DISC's
    reader = TimeMachine(ckpt_path=tmp_path)
    assert reader.to(gen, frozen=True).file.name == "GEN-2.safetensors"
    assert reader.to(disc, frozen=True).file.name == "DISC-1.safetensors"
    jdisc = jcraft.realize(Net("DISC", hidden=4))  # the JAX realization finds DISC's too
    assert reader.to(jdisc, frozen=True).step == 10
    with pytest.raises(CheckpointError, match=r"no anchor of scope 'CRITIC' in .*test_models_sh"):
        reader.to(tcraft.realize(Net("CRITIC")))


def test_a_folder_without_anchors_of_the_scope_names_folder_and_scope(tmp_path):
    with pytest.raises(CheckpointError, match=rf"no anchor of scope 'Net' in {tmp_path}"):
        TimeMachine(ckpt_path=tmp_path).to(tcraft.realize(Net()))
    with pytest.raises(CheckpointError, match=r"no anchor of scope 'Net' in .*missing"):
        TimeMachine(ckpt_path=tmp_path / "missing").to(tcraft.realize(Net()))


@pytest.mark.parametrize("scope", ["net[1]", "exp/run", "a*b?", ".hidden", "50%", "x-1"])
def test_scopes_with_glob_characters_or_slashes_number_and_retain(tmp_path, scope):
    module = tcraft.realize(Net(scope))
    tm = TimeMachine(save_path=tmp_path, max_anchors=2)
    paths = [tm.drop(module, step=step) for step in (1, 2, 3)]
    stem = anchor_stem(scope)
    assert [p.name for p in paths] == [f"{stem}-{n}.safetensors" for n in (1, 2, 3)]
    assert all(p.parent == tmp_path for p in paths)  # "/" is escaped, no sub-folder
    assert sorted(p.name for p in tmp_path.iterdir()) == [paths[1].name, paths[2].name]
    assert TimeMachine(ckpt_path=tmp_path).to(module).step == 3


def test_a_scope_that_looks_like_another_scopes_anchor_stays_apart(tmp_path):
    a, a1 = tcraft.realize(Net("a")), tcraft.realize(Net("a-1"))
    tm = TimeMachine(save_path=tmp_path, max_anchors=1)
    tm.drop(a1, step=5)  # a-1-1.safetensors
    tm.drop(a, step=1)
    tm.drop(a, step=2)  # retention of "a" must not count a-1-1 as a-1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-1-1.safetensors", "a-2.safetensors"]
    assert TimeMachine(ckpt_path=tmp_path).to(a1).step == 5


scopes = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)


@settings(max_examples=25)
@given(first=scopes, second=scopes, keep=st.integers(1, 3), drops=st.integers(1, 4))
def test_any_two_scopes_number_and_retain_their_own_anchors(first, second, keep, drops):
    """Law: for any scope texts, drop k times numbers 1..k, keeps the newest `keep` of each."""
    mod = {s: tcraft.realize(Net(s, hidden=2)) for s in {first, second}}
    with tempfile.TemporaryDirectory() as folder:
        tm = TimeMachine(save_path=folder, max_anchors=keep)
        for step in range(1, drops + 1):
            for scope, module in mod.items():
                path = tm.drop(module, step=step)
                assert path.name == f"{anchor_stem(scope)}-{step}.safetensors"
                assert path.parent == Path(folder).absolute()
        for scope, module in mod.items():
            newest = range(max(1, drops - keep + 1), drops + 1)
            assert all(
                (Path(folder) / f"{anchor_stem(scope)}-{n}.safetensors").is_file() for n in newest
            )
            assert TimeMachine(ckpt_path=folder).to(module).manifest["scope"] == scope
            assert TimeMachine(ckpt_path=folder).to(module).step == drops
        assert len(list(Path(folder).iterdir())) == len(mod) * min(keep, drops)


def test_only_regular_files_are_numbered_anchors(tmp_path):
    """A folder or a dangling link named like an anchor is neither loaded nor deleted."""
    module = tcraft.realize(Net())
    tm = TimeMachine(ckpt_path=tmp_path, save_path=tmp_path, max_anchors=1)
    tm.drop(module, step=1)
    (tmp_path / "Net-5.safetensors").mkdir()
    os.symlink(tmp_path / "nowhere", tmp_path / "Net-9.safetensors")
    assert tm.to(module).step == 1
    assert tm.drop(module, step=2).name == "Net-2.safetensors"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "Net-2.safetensors",
        "Net-5.safetensors",
        "Net-9.safetensors",
    ]
    assert tm.to(module).step == 2


def test_a_missing_anchor_file_says_it_is_missing(tmp_path):
    module = tcraft.realize(Net())
    with pytest.raises(CheckpointError, match=r"ckpt_path .*gone\.safetensors does not exist"):
        TimeMachine(ckpt_path=tmp_path / "gone.safetensors").to(module)
    with pytest.raises(CheckpointError, match="there is no such folder"):
        TimeMachine(ckpt_path=tmp_path / "gone").to(module)
    with pytest.raises(CheckpointError, match=r"x\.safetensors: it does not exist"):
        TimeMachine(ckpt_path=tmp_path).to(module, "x")
