"""nebulgym's spellings: ``@patch_dataset``, ``@accelerate_dataset`` and ``NebulDataset``."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.data import DataLoader, Dataset

import dualtrain
from dualtrain import Preloader, accelerate_dataset
from dualtrain.errors import ArgumentError
from dualtrain.preload.decorators import patch_dataset  # nebulgym's names, at their homes
from dualtrain.preload.preloader import NebulDataset
from tests.preload.datasets import (
    BareDataset,
    CalledDataset,
    CustomDataset,
    PlainCustomDataset,
    Recording,
    label_of,
    make_images,
    read_image,
    same_item,
)


@pytest.fixture(scope="module", params=["png", "jpg"])
def img_paths(request, tmp_path_factory) -> list[str]:
    return make_images(tmp_path_factory.mktemp(request.param), 14, request.param)


def epochs(dataset, epochs: int = 2, batch_size: int = 4, seed: int = 0) -> list[list]:
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator)
    return [list(loader) for _ in range(epochs)]


def same_epochs(a: list[list], b: list[list]) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(same_item(p, q) for p, q in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


# -- nebulgym's README dataset, as written -------------------------------------------------------


@pytest.mark.parametrize("cls", [CustomDataset, CalledDataset, BareDataset])
def test_readme_dataset_serves_what_the_plain_one_does_under_a_dataloader(cls, img_paths):
    plain = PlainCustomDataset(img_paths, label_of, read_image)
    dataset = cls(img_paths, label_of, read_image)
    assert isinstance(dataset, cls) and isinstance(dataset, Dataset)
    want, got = epochs(plain), epochs(dataset)
    assert same_epochs(got, want)
    assert isinstance(got[0][0][0], torch.Tensor) and got[0][0][0].shape == (4, 3, 12, 16)
    stats = dataset.preloader.stats()
    assert stats["loads"] == len(img_paths) and stats["hits"] >= len(img_paths)  # epoch two
    assert dataset.preloader.preloaded_data == 20


@settings(max_examples=10)
@given(seed=st.integers(0, 2**32), batch_size=st.integers(1, 6))
def test_readme_dataset_matches_plain_for_any_shuffle(seed, batch_size, img_paths):
    plain = PlainCustomDataset(img_paths, label_of, read_image)
    dataset = CustomDataset(img_paths, label_of, read_image)
    got = epochs(dataset, 1, batch_size, seed)
    assert same_epochs(got, epochs(plain, 1, batch_size, seed))


def test_readme_dataset_with_its_own_planned_sampler(img_paths):
    plain = PlainCustomDataset(img_paths, label_of, read_image)
    dataset = CustomDataset(img_paths, label_of, read_image)
    sampler = dataset.preloader.sampler(shuffle=True, seed=4)
    order = list(Preloader(plain).sampler(shuffle=True, seed=4))
    batches = list(DataLoader(dataset, batch_size=5, sampler=sampler))
    want = list(DataLoader(plain, batch_size=5, sampler=order))
    assert same_epochs([batches], [want])


def test_nebul_dataset_takes_nebulgyms_positional_arguments(img_paths):
    plain = PlainCustomDataset(img_paths, label_of, read_image)
    dataset = NebulDataset(plain, 5, 10**6)
    assert isinstance(dataset, Preloader)
    assert dataset.preloaded_data == 5 and dataset.max_memory_size == 10**6
    assert same_epochs(epochs(dataset), epochs(plain))
    keywords = NebulDataset(input_data=plain, preloaded_data=3, max_memory_size=2**20, threads=0)
    assert keywords.max_memory_size == 2**20 and keywords.cache.threads == 0
    assert keywords._images is plain._images  # the source's attributes, forwarded


# -- the decorated instance stays what it was ----------------------------------------------------


@accelerate_dataset(max_memory_size=10**6)
class Squares(Dataset):
    """A decorated class with methods and attributes of its own."""

    kind = "squares"

    def __init__(self, n: int) -> None:
        self.n = n
        self.loads: list[int] = []

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} is out of range")
        self.loads.append(i)
        return torch.tensor([i * i])

    def __len__(self) -> int:
        return self.n

    def total(self) -> int:
        return sum(i * i for i in range(self.n))


def test_decorated_instance_keeps_its_class_methods_and_attributes():
    squares = Squares(5)
    assert type(squares) is Squares and isinstance(squares, Dataset)
    assert len(squares) == 5 and squares.n == 5 and squares.kind == "squares"
    assert squares.total() == 30
    assert same_item(squares[3], torch.tensor([9])) and same_item(squares[3], torch.tensor([9]))
    assert squares.loads == [3]  # the second one was a hit
    assert squares.preloader.max_memory_size == 10**6
    assert squares.preloader.stats()["hits"] == 1
    assert Squares.__name__ == "Squares" and Squares.__getitem__.__name__ == "__getitem__"
    with pytest.raises(IndexError, match="out of range") as info:
        squares[7]
    assert "item 7" in " ".join(info.value.__notes__)
    assert [int(x) for x in Squares(4)] == [0, 1, 4, 9]  # iteration stops at its IndexError


def test_subclass_of_a_decorated_class():
    class Cubes(Squares):
        def __getitem__(self, i: int) -> torch.Tensor:
            return super().__getitem__(i) * i

    cubes = Cubes(4)
    assert isinstance(cubes, Squares) and cubes.total() == 14
    assert [int(cubes[i]) for i in range(4)] == [0, 1, 8, 27]
    assert [int(cubes[i]) for i in range(4)] == [0, 1, 8, 27]
    assert cubes.loads == [0, 1, 2, 3]  # Squares' items cached once; Cubes' work on top


def test_a_dataloader_serves_an_undecorated_subclass_its_own_items():
    # The decorator adds __getitems__ to the base; torch's DataLoader calls it for the
    # subclass too, and it used to serve the base's items, skipping the override.
    class Shifted(Squares):
        def __getitem__(self, i: int) -> torch.Tensor:
            return super().__getitem__(i) + 100

    @accelerate_dataset(max_memory_size=10**5)
    class Decorated(Shifted):  # decorated again below the override: its own items cached
        def __getitem__(self, i: int) -> torch.Tensor:
            return super().__getitem__(i) * 2

    class Unchanged(Squares):  # no override: the base's batch path (one get_many a batch)
        pass

    shifted, decorated, unchanged = Shifted(5), Decorated(5), Unchanged(5)
    for _ in range(2):
        assert [b.tolist() for b in DataLoader(shifted, batch_size=2)] == [
            [[100], [101]], [[104], [109]], [[116]]
        ]  # fmt: skip
        assert [b.tolist() for b in DataLoader(decorated, batch_size=3)] == [
            [[200], [202], [208]], [[218], [232]]
        ]  # fmt: skip
        assert [b.tolist() for b in DataLoader(unchanged, batch_size=5)] == [
            [[0], [1], [4], [9], [16]]
        ]  # fmt: skip
    assert shifted.loads == [0, 1, 2, 3, 4]  # the base's items cached under the override
    assert decorated.loads == [0, 1, 2, 3, 4] and decorated.preloader.stats()["hits"] == 5
    assert unchanged.loads == [0, 1, 2, 3, 4] and unchanged.preloader.stats()["hits"] == 5


def test_decorated_subclass_of_a_decorated_class_caches_its_own_items():
    # The subclass used to get the base class's items: the base's __init__ made the cache
    # over the base's __getitem__ first.
    @accelerate_dataset(preloaded_data=3)
    class Cubes(Squares):
        def __init__(self, n: int) -> None:
            super().__init__(n)
            self.cube_loads = 0

        def __getitem__(self, i: int) -> torch.Tensor:
            self.cube_loads += 1
            return super().__getitem__(i) * i

    cubes = Cubes(4)
    assert [int(cubes[i]) for i in range(4)] == [0, 1, 8, 27]
    assert [int(cubes[i]) for i in range(4)] == [0, 1, 8, 27]
    assert cubes.cube_loads == 4 and cubes.loads == [0, 1, 2, 3]
    assert cubes.preloader.preloaded_data == 3 and cubes.preloader.stats()["hits"] == 4
    assert Squares(2).preloader.preloaded_data == 20  # the base keeps its settings

    @accelerate_dataset
    class Again(Squares):  # decorated, with the base's __getitem__
        pass

    again = Again(3)
    assert [int(again[i]) for i in (2, 2, 1)] == [4, 4, 1] and again.loads == [2, 1]
    assert again.preloader.max_memory_size != 10**6  # its own (default) settings


def test_decorating_twice_wraps_once_with_the_last_settings():
    @accelerate_dataset(max_memory_size=4000)
    @accelerate_dataset(max_memory_size=2000, preloaded_data=2)
    class Twice(Recording):
        pass

    twice = Twice(5)
    assert twice.preloader.max_memory_size == 4000 and twice.preloader.preloaded_data == 20
    assert same_item(twice[1], torch.full((4,), 1.0)) and same_item(twice[1], twice[1])
    assert twice.loads == [1]


def test_a_class_with_its_own_getitems_keeps_it():
    @accelerate_dataset()
    class Batched(Dataset):
        def __init__(self) -> None:
            self.batches: list[list[int]] = []

        def __getitem__(self, i: int) -> int:
            return i * 10

        def __len__(self) -> int:
            return 6

        def __getitems__(self, indices: list[int]) -> list[int]:
            self.batches.append(list(indices))
            return [self[i] for i in indices]  # each item through the cache

    batched = Batched()
    first = list(DataLoader(batched, batch_size=4))
    second = list(DataLoader(batched, batch_size=4))
    assert [b.tolist() for b in first] == [[0, 10, 20, 30], [40, 50]]
    assert [b.tolist() for b in second] == [b.tolist() for b in first]
    assert batched.batches == [[0, 1, 2, 3], [4, 5]] * 2
    assert batched.preloader.stats()["hits"] == 6 and batched.preloader.stats()["loads"] == 6


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_decorated_instance_round_trips_with_equal_items(how, img_paths):
    dataset = CustomDataset(img_paths, label_of, read_image)
    before = [dataset[i] for i in range(4)]
    other = pickle.loads(pickle.dumps(dataset)) if how == "pickle" else copy.deepcopy(dataset)
    assert type(other) is CustomDataset and other is not dataset and len(other) == len(dataset)
    for i in range(len(dataset)):
        assert same_item(other[i], dataset[i])
    assert all(same_item(other[i], before[i]) for i in range(4))
    assert isinstance(other.preloader, Preloader)


@accelerate_dataset
class Scaled(Dataset):
    def __init__(self, n: int) -> None:
        self.n, self.scale = n, 1

    def __getitem__(self, i: int) -> int:
        return i * self.scale

    def __len__(self) -> int:
        return self.n


def test_copies_serve_their_own_items():
    # A shallow copy used to serve the original's items (its dict held the original's
    # cache, bound to the original); deep copies shared one cache folder between them.
    base = Scaled(4)
    assert base[1] == 1
    shallow = copy.copy(base)
    shallow.scale = 10
    assert shallow[1] == 10 and base[1] == 1 and shallow.preloader is not base.preloader
    one, two = copy.deepcopy(base), copy.deepcopy(base)
    two.scale = 100
    assert [one[2], two[2], base[2]] == [2, 200, 2]
    assert [one[2], two[2], base[2]] == [2, 200, 2]
    assert two.preloader.stats()["hits"] == 1


def test_preloader_round_trips_with_equal_items():
    p = Preloader(Recording(5), max_memory_size=10**5)
    before = [p[i] for i in range(5)]
    for other in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):
        assert len(other) == 5 and other.max_memory_size == 10**5
        assert all(same_item(other[i], before[i]) for i in range(5))


# -- what it refuses ------------------------------------------------------------------------------


def _no_getitem():
    class NoGetitem:
        def __len__(self) -> int:
            return 0

    return NoGetitem


def _no_len():
    class NoLen:
        def __getitem__(self, i: int) -> int:
            return i

    return NoLen


def _has_preloader():
    class HasPreloader:
        preloader = "mine"

        def __getitem__(self, i: int) -> int:
            return i

        def __len__(self) -> int:
            return 0

    return HasPreloader


@pytest.mark.parametrize(
    ("make", "words"),
    [(_no_getitem, "__getitem__"), (_no_len, "__len__"), (_has_preloader, "preloader")],
)
@pytest.mark.parametrize("decorator", [accelerate_dataset, accelerate_dataset(), patch_dataset()])
def test_a_class_that_cannot_be_decorated_is_refused_by_name(make, words, decorator):
    cls = make()
    with pytest.raises(ArgumentError, match=words) as info:
        decorator(cls)
    assert cls.__name__ in str(info.value)
    assert not hasattr(cls, "__dualtrain_preload__")  # nothing changed


def test_unknown_keywords_and_bad_settings_are_refused():
    with pytest.raises(ArgumentError, match=r"options.*preload_data"):
        accelerate_dataset(preload_data=3)
    with pytest.raises(ArgumentError, match=r"options.*workers"):
        patch_dataset(preloaded_data=3, workers=2)
    with pytest.raises(ArgumentError, match="max_memory_size"):
        accelerate_dataset(max_memory_size=-5)
    with pytest.raises(ArgumentError, match="preloaded_data"):
        patch_dataset(preloaded_data="many")
    with pytest.raises(ArgumentError, match="cls"):
        accelerate_dataset(20)
    with pytest.raises(ArgumentError, match="cls"):
        accelerate_dataset()(lambda i: i)
    with pytest.raises(TypeError):
        accelerate_dataset(CustomDataset, 20)  # settings are keywords only


def test_a_class_with_slots_is_told_to_wrap_its_instances():
    @accelerate_dataset
    class Slotted:
        __slots__ = ("n",)

        def __init__(self, n: int) -> None:
            self.n = n

        def __getitem__(self, i: int) -> int:
            return i

        def __len__(self) -> int:
            return self.n

    with pytest.raises(ArgumentError, match="Preloader"):
        Slotted(3)


@pytest.mark.parametrize("name", ["NebulDataset", "patch_dataset"])
def test_the_old_public_paths_warn_and_name_the_compat_namespace(name):
    home = {"NebulDataset": NebulDataset, "patch_dataset": patch_dataset}[name]
    for module in (dualtrain, dualtrain.preload):
        with pytest.warns(DeprecationWarning, match="dualtrain_torch.compat.nebulgym"):
            assert getattr(module, name) is home
    assert name not in dualtrain.__all__ and name not in dualtrain.preload.__all__
