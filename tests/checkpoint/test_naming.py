"""Issue 11 item 1: names are symmetric between drop and to, and stay inside their folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualtrain import ArgumentError, TimeMachine
from tests.checkpoint.crafts import Net, assert_same, torch_values, train_torch

tcraft = pytest.importorskip("dualtrain_torch.craft")


@pytest.fixture
def trained():
    module = tcraft.realize(Net(), seed=1)
    train_torch(module)
    return module


@pytest.mark.parametrize("name", ["best", "best.v2", "runs/best"])
def test_drop_and_to_take_the_same_names(tmp_path, trained, name):
    tm = TimeMachine(save_path=tmp_path)
    returned = tm.drop(trained, name)
    assert returned == (tmp_path / f"{name}.safetensors").absolute()
    assert returned.is_file() and returned.is_absolute()
    for given in (name, f"{name}.safetensors", returned, str(returned)):
        for reader in (tm, TimeMachine(ckpt_path=tmp_path)):
            back = tcraft.realize(Net(), seed=2)
            assert list(reader.to(back, given, frozen=True)) == []
            assert_same(torch_values(back), torch_values(trained))


def test_the_returned_path_loads_from_a_relative_save_path(tmp_path, monkeypatch, trained):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other").mkdir()
    tm = TimeMachine(ckpt_path="ckpt", save_path="ckpt")
    returned = tm.drop(trained)
    monkeypatch.chdir(tmp_path / "other")  # the returned path does not depend on the cwd
    back = tcraft.realize(Net(), seed=2)
    TimeMachine(ckpt_path="elsewhere").to(back, returned, frozen=True)
    assert_same(torch_values(back), torch_values(trained))


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "..", "sub/../../x"])
def test_names_leading_out_of_the_folder_are_refused(tmp_path, trained, name):
    (tmp_path / "ckpt").mkdir()
    tm = TimeMachine(ckpt_path=tmp_path / "ckpt", save_path=tmp_path / "ckpt")
    with pytest.raises(ArgumentError, match=r"file must be a name that stays inside .*ckpt"):
        tm.drop(trained, name)
    with pytest.raises(ArgumentError, match="file must be"):
        tm.to(trained, name)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ckpt"]  # nothing written


def test_absolute_paths_and_names_inside_the_folder_stay_allowed(tmp_path, trained):
    tm = TimeMachine(save_path=tmp_path / "ckpt")
    outside = tm.drop(trained, tmp_path / "abs")
    inside = tm.drop(trained, "a/../b")
    assert outside == tmp_path / "abs.safetensors" and inside == tmp_path / "ckpt/b.safetensors"


def test_a_file_named_without_the_suffix_still_loads(tmp_path, trained):
    anchor = TimeMachine(save_path=tmp_path).drop(trained, "x")
    anchor.rename(tmp_path / "plain")
    back = tcraft.realize(Net(), seed=3)
    TimeMachine(ckpt_path=tmp_path).to(back, "plain", frozen=True)
    assert_same(torch_values(back), torch_values(trained))


def test_embedding_anchors_take_the_same_names(tmp_path):
    torch = pytest.importorskip("torch")
    from dualtrain import EmbeddingStore
    from dualtrain_torch import attach

    store = EmbeddingStore(10, 4, seed=1)
    rows = attach(store, torch.optim.SGD, lr=0.1)
    tm = TimeMachine(save_path=tmp_path)
    returned = tm.drop_embeddings(rows, "emb")
    assert returned == (tmp_path / "emb.safetensors").absolute()
    for given in ("emb", "emb.safetensors", returned):
        other = EmbeddingStore(10, 4, seed=2)
        tm.to_embeddings(attach(other, torch.optim.SGD, lr=0.1), given)
        np.testing.assert_array_equal(other.table, store.table)
    with pytest.raises(ArgumentError, match="file must be a name that stays inside"):
        tm.drop_embeddings(rows, "../emb")
    with pytest.raises(ArgumentError, match="file must be a name that stays inside"):
        tm.to_embeddings(rows, "../emb")
    with pytest.raises(ArgumentError, match="file must be an embedding anchor's name"):
        tm.to_embeddings(rows)


# ---- adversarial review: drop's numbered names are its own; names never leave the folder ----


@pytest.mark.parametrize("name", ["MLP-3", "MLP-0099", "MLP-7.safetensors", "x-1-2", "Net-0"])
def test_a_name_of_the_numbered_form_is_refused_at_drop(tmp_path, trained, name):
    tm = TimeMachine(save_path=tmp_path, max_anchors=2)
    with pytest.raises(ArgumentError, match="file must be a name without the numbered-anchor"):
        tm.drop(trained, name)
    assert list(tmp_path.iterdir()) == []


def test_numbering_and_retention_see_only_drops_own_anchors(tmp_path, trained):
    tm = TimeMachine(save_path=tmp_path, max_anchors=2)
    tm.drop(trained, "Net-\u0663")  # an Arabic-Indic digit: a name, not a number
    (tmp_path / "Net-0099.safetensors").write_bytes(b"not drop's")  # a leading zero: not drop's
    names = [tm.drop(trained).name for _ in range(3)]
    assert names == ["Net-1.safetensors", "Net-2.safetensors", "Net-3.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "Net-0099.safetensors",
        "Net-2.safetensors",
        "Net-3.safetensors",
        "Net-\u0663.safetensors",
    ]
    assert (
        TimeMachine(ckpt_path=tmp_path).to(tcraft.realize(Net())).file.name == "Net-3.safetensors"
    )


@pytest.mark.parametrize("name", [".", "./", "sub/..", "a/./..", "sub/", Path("")])
def test_a_name_of_the_folder_itself_is_refused(tmp_path, trained, name):
    folder = tmp_path / "runs"
    folder.mkdir()
    tm = TimeMachine(ckpt_path=folder, save_path=folder)
    with pytest.raises(ArgumentError, match=r"file must be a file name inside .*runs"):
        tm.drop(trained, name)
    with pytest.raises(ArgumentError, match="file must be"):
        tm.to(trained, name)
    with pytest.raises(ArgumentError, match="file must be"):
        tm.drop_embeddings(object(), name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert list(folder.iterdir()) == []


def test_a_copied_time_machine_keeps_its_settings_apart(tmp_path):
    """copy.copy gives a TimeMachine whose paths and limit are its own, as when they were
    plain attributes (they now live on the writer and reader it holds)."""
    import copy

    tm = TimeMachine(ckpt_path=tmp_path / "a", save_path=tmp_path / "b", max_anchors=3)
    twin = copy.copy(tm)
    twin.save_path, twin.ckpt_path, twin.max_anchors = tmp_path / "c", None, 1
    assert (tm.ckpt_path, tm.save_path, tm.max_anchors) == (tmp_path / "a", tmp_path / "b", 3)
    assert (twin.ckpt_path, twin.save_path, twin.max_anchors) == (None, tmp_path / "c", 1)
    deep = copy.deepcopy(tm)
    deep.save_path = tmp_path / "d"
    assert tm.save_path == tmp_path / "b"
