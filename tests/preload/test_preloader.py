"""`Preloader`: what it wraps, the keys it caches, items unchanged, and the order it follows."""

from __future__ import annotations

import collections
import copy
import fractions
import pickle
from decimal import Decimal

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from PIL import Image
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
)

from dualtrain import Preloader
from dualtrain.errors import ArgumentError
from dualtrain.preload import nbytes
from dualtrain.preload.preloader import NebulDataset
from tests.preload.datasets import Recording, same_item
from tests.strategies import arrays

Pair = collections.namedtuple("Pair", "left right")


def batches_equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(same_item(x, y) for x, y in zip(a, b, strict=True))


# -- what it wraps ---------------------------------------------------------------------------


@given(
    n=st.integers(1, 12),
    picks=st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(["int", "neg", "np", "torch"]))
    ),
)
def test_int_like_indices_share_one_entry_per_item(n, picks):
    # Law: p[i] == source[i] for ints, negatives, NumPy and torch ints; each item loads once.
    source = [f"item {i}" for i in range(n)]
    p = Preloader(source)
    for raw, kind in picks:
        i = raw % n
        index = {"int": i, "neg": i - n, "np": np.int64(i), "torch": torch.tensor(i)}[kind]
        assert p[index] == source[i]
    stats = p.stats()
    assert stats["loads"] == stats["items"] == len({raw % n for raw, _ in picks})
    assert stats["hits"] == len(picks) - stats["loads"]


def test_wraps_a_dict_like_source_with_str_keys():
    class Table:
        def __init__(self) -> None:
            self.rows = {"cat": [1, 2], "dog": [3]}

        def __getitem__(self, key: str) -> list[int]:
            return self.rows[key]

        def __len__(self) -> int:
            return len(self.rows)

        def names(self) -> list[str]:
            return sorted(self.rows)

    for source in ({"cat": [1, 2], "dog": [3]}, Table()):
        p = Preloader(source)
        assert p["dog"] == [3] and p["cat"] == [1, 2] and p["cat"] == [1, 2]
        assert p.stats()["hits"] == 1 and p.stats()["loads"] == 2
        with pytest.raises(KeyError):
            p["cow"]
    assert p.names() == ["cat", "dog"]  # the source's own methods, forwarded
    assert p.rows is source.rows


def test_wraps_a_torch_dataset_counting_compact_copies_only():
    features, labels = torch.randn(5000, 8), torch.arange(5000)
    source = TensorDataset(features, labels)
    p = Preloader(source, max_memory_size=10**6)
    for i in range(10):
        assert same_item(p[i], source[i])
        assert same_item(p[i], source[i])
    # Each held row is a copy of 8 floats and one int, not views pinning the whole tensors.
    expected = sum(nbytes((features[i].clone(), labels[i].clone())) for i in range(10))
    stats = p.stats()
    assert stats["local_bytes"] == stats["resident_bytes"] == expected
    assert expected < features.untyped_storage().nbytes() // 10
    assert stats["hits"] == 10 and stats["loads"] == 10


def test_numpy_rows_come_back_equal_and_count_compact_copies():
    table = np.arange(2000 * 32, dtype=np.float64).reshape(2000, 32)
    p = Preloader(table, max_memory_size=10**6)
    rows = [p[i] for i in range(0, 2000, 100)]
    for k, row in enumerate(rows):
        assert same_item(row, table[100 * k])
        assert not np.shares_memory(row, table)
    again = p[300]
    assert same_item(again, table[300]) and not np.shares_memory(again, table)
    stats = p.stats()
    assert stats["items"] == 20 and stats["hits"] == 1
    assert stats["local_bytes"] == 20 * nbytes(table[0].copy()) < table.nbytes // 50


def test_preloader_is_a_dataset_again():
    source = Recording(6)
    p = Preloader(source)
    assert len(p) == 6
    assert batches_equal(list(p), [source[i] for i in range(6)])
    assert batches_equal(p.__getitems__([5, 0, -1]), [source[5], source[0], source[5]])
    assert p.n == 6 and p.shape == (4,)  # attributes forwarded to the source
    with pytest.raises(AttributeError):
        _ = p.no_such_attribute


# -- keys that are not one item bypass the cache ---------------------------------------------


TABLE = np.arange(5 * 3).reshape(5, 3)
TENSOR = torch.arange(10) * 10
SEVERAL = [
    (TABLE, slice(2, 5)),
    (TABLE, slice(None, None, -2)),
    (TABLE, Ellipsis),
    (TABLE, None),
    (TABLE, True),
    (TABLE, np.True_),
    (TABLE, [1, 3]),
    (TABLE, (slice(0, 2), 1)),
    (TABLE, (1, Ellipsis)),
    (TABLE, np.array([0, 2])),
    (TABLE, np.array([True, False, True, False, False])),
    (TENSOR, torch.tensor([3])),
    (TENSOR, torch.tensor([1, 2])),
    (TENSOR, torch.tensor(True)),
    (TENSOR, Ellipsis),
    (TENSOR, slice(1, 8, 3)),
]


@pytest.mark.parametrize(("source", "index"), SEVERAL, ids=[repr(i) for _, i in SEVERAL])
def test_indices_selecting_several_items_bypass_the_cache(source, index):
    # Ellipsis, None, bools and index tensors used to be cached as keys: `p[True]` served
    # source[1], `p[torch.tensor([3])]` served source[3] (not a 1-item tensor), and a tensor
    # key (hashed by identity) made a new entry at every call.
    p = Preloader(source)
    for _ in range(2):
        assert same_item(p[index], source[index])
    assert p.stats()["items"] == 0 and p.stats()["loads"] == 0


def test_tensor_index_with_an_order_is_served():
    # A tensor key used to be compared with the plan's ints: "Boolean value of Tensor with
    # more than one value is ambiguous".
    source = torch.arange(10) * 10
    p = Preloader(source, order=range(10))
    assert same_item(p[torch.tensor([1, 2])], source[torch.tensor([1, 2])])
    assert same_item(p[torch.tensor(4)], source[4])


def test_tuple_keys_hit_one_entry_whatever_their_int_types():
    table = np.arange(20).reshape(4, 5)
    p = Preloader(table)
    assert p[1, 2] == p[np.int64(1), torch.tensor(2)] == table[1, 2]
    assert p.stats()["items"] == 1 and p.stats()["hits"] == 1


class Echo:
    """A source whose item names the exact key it was asked for (1.0 is not 1)."""

    def __getitem__(self, key: object) -> str:
        return f"{type(key).__name__} {key!r}"

    def __len__(self) -> int:
        return 10


# Keys equal (as dict keys) to the ints 0..3, of types a source may tell apart, or not.
KINDS = (int, float, Decimal, fractions.Fraction, complex, np.float64, str)
equal_to_ints = st.builds(lambda kind, i: kind(i), st.sampled_from(KINDS), st.integers(0, 3))
any_keys = st.one_of(
    equal_to_ints,
    equal_to_ints,
    st.tuples(equal_to_ints, equal_to_ints),
    st.floats(allow_nan=False),
    st.text(max_size=2),
)


@given(keys=st.lists(any_keys, min_size=2, max_size=12))
def test_keys_equal_to_an_int_never_hit_its_entry(keys):
    # Law: p[k] == source[k] for any keys in any order. 1.0 == 1 as dict keys, so p[1.0]
    # after p[1] used to serve the cached source[1].
    source, p = Echo(), Preloader(Echo())
    for key in keys:
        assert p[key] == source[key]
    worker = pickle.loads(pickle.dumps(p))  # a worker process's copy: the shared files
    for key in keys:
        assert worker[key] == source[key]


def test_a_float_index_of_a_list_is_refused_after_its_int_was_cached():
    p = Preloader(["a", "b", "c"])
    assert p[1] == "b"
    with pytest.raises(TypeError, match="float"):
        p[1.0]
    with pytest.raises(TypeError, match="float"):
        p[np.float64(1.0)]
    assert p[1] == "b" and p.stats()["items"] == 1


def test_slice_reaches_the_source_not_the_cache():
    items = list(range(8))
    p = Preloader(items)
    assert p[2:5] == [2, 3, 4] and p[::-3] == items[::-3]
    assert p.stats()["loads"] == 0 and p.stats()["items"] == 0


@pytest.mark.parametrize("index", [10, -11, np.int64(12)])
def test_index_error_passes_through_naming_the_index(index):
    source = Recording(10)
    p = Preloader(source)
    with pytest.raises(IndexError, match="out of range") as info:
        p[index]
    assert f"item {int(index)}" in " ".join(info.value.__notes__)
    assert p.stats()["items"] == 0
    with pytest.raises(IndexError):
        Preloader(list(range(3)))[3]


# -- copies -----------------------------------------------------------------------------------


class Split:
    """A dataset whose items depend on a setting a copy may change (train or val)."""

    def __init__(self, n: int = 4) -> None:
        self.split, self.n = "train", n

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} is out of range")
        return f"{self.split} {i}"

    def __len__(self) -> int:
        return self.n


def serves(dataset, split: str) -> bool:
    return [dataset[i] for i in range(len(dataset))] == [f"{split} {i}" for i in range(4)]


def test_a_deep_copy_gets_a_fresh_cache_with_the_same_settings():
    # The deep copy used to join the original's shared folder (through the cache's
    # pickling): val's items reached train's DataLoader workers.
    train = Preloader(Split(), 10**5, preloaded_data=3, order=[3, 2, 1, 0], threads=1)
    assert train[0] == "train 0"
    val = copy.deepcopy(train)
    val.source.split = "val"
    assert serves(val, "val") and serves(train, "train")
    worker = pickle.loads(pickle.dumps(train))  # what a spawned DataLoader worker gets
    assert serves(worker, "train")
    assert val.cache is not train.cache and val.source is not train.source
    assert (val.max_memory_size, val.preloaded_data, val.cache.threads) == (10**5, 3, 1)
    assert val.stats()["loads"] == 4 and val.stats()["resident_bytes"] <= 10**5
    planned = copy.deepcopy(train)
    assert [planned[i] for i in (3, 2, 1, 0, 3)] == [f"train {i}" for i in (3, 2, 1, 0, 3)]
    assert planned.stats()["misses"] == 0  # its order, loaded ahead from its first item on
    assert train.stats()["loads"] == 4  # train's own, not val's
    nebul = copy.deepcopy(NebulDataset(Split(), 2, 10**4))
    assert type(nebul) is NebulDataset and serves(nebul, "train")


def test_a_shallow_copy_gets_its_own_cache_over_the_same_source():
    # A shallow copy shared the cache, bound to the original's source: given a source of
    # its own, it served the original's items.
    train = Preloader(Split(), 10**5)
    assert serves(train, "train")
    val = copy.copy(train)
    assert val.source is train.source and val.cache is not train.cache
    val.source = Split()
    val.source.split = "val"
    assert serves(val, "val") and serves(train, "train")
    train.source = Split(4)  # setting the source gives a new cache over it, too
    train.source.split = "test"
    assert serves(train, "test")
    with pytest.raises(ArgumentError, match="source"):
        train.source = 5


# -- items of any type come back unchanged -------------------------------------------------

TORCH_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32",
                "float64", "complex64", "bfloat16")  # fmt: skip


@st.composite
def images(draw) -> Image.Image:
    mode = draw(st.sampled_from(["L", "RGB", "RGBA", "I;16"]))
    size = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    depth = {"L": 1, "RGB": 3, "RGBA": 4, "I;16": 2}[mode]
    data = draw(st.binary(min_size=size[0] * size[1] * depth, max_size=size[0] * size[1] * depth))
    return Image.frombytes(mode, size, data)


@st.composite
def tensors(draw) -> torch.Tensor:
    values = draw(arrays(dtypes=TORCH_DTYPES))
    if values.dtype.name == "bfloat16":
        t = torch.from_numpy(values.view(np.uint16)).view(torch.bfloat16).clone()
    else:
        t = torch.from_numpy(values).clone()
    if t.is_floating_point() and draw(st.booleans()):
        t.requires_grad_(True)
    return t


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
    arrays(),
    tensors(),
    images(),
)
items = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.builds(Pair, inner, inner),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
    ),
    max_leaves=6,
)


@given(values=st.lists(items, min_size=1, max_size=4), copy=st.booleans())
def test_items_of_any_type_come_back_unchanged(values, copy):
    p = Preloader(values, copy=copy)
    for i, value in enumerate(values):
        assert same_item(p[i], value)  # a miss
        assert same_item(p[i], value)  # a hit
    assert batches_equal(p.__getitems__(range(len(values))), values)


def test_hits_are_copies_a_consumer_may_change():
    source = [np.zeros(3), {"t": torch.zeros(2), "xs": [1]}]
    p = Preloader(source)
    p[0][:] = 7
    item = p[1]
    item["t"] += 1
    item["xs"].append(2)
    assert same_item(p[0], np.zeros(3)) and same_item(p[1], {"t": torch.zeros(2), "xs": [1]})


def test_jax_arrays_come_back_unchanged():
    import jax.numpy as jnp

    source = [jnp.arange(6.0).reshape(2, 3), {"x": jnp.ones(2, jnp.bfloat16), "y": (jnp.int32(3),)}]
    p = Preloader(source)
    for _ in range(2):
        for i, value in enumerate(source):
            assert same_item(p[i], value)
    assert p.stats()["local_bytes"] >= 6 * 4 + 2 * 2 + 4


# -- the order it follows ----------------------------------------------------------------------


def test_without_an_order_nothing_is_loaded_ahead():
    source = Recording(30)
    p = Preloader(source, preloaded_data=5)
    for i in (0, 1, 2, 7):
        p[i]
    assert source.loads == [0, 1, 2, 7]  # never index+1..+k


@settings(max_examples=20)
@given(
    order=st.integers(1, 12).flatmap(lambda n: st.permutations(range(n))), ahead=st.integers(1, 5)
)
def test_order_is_loaded_in_its_order_and_epoch_two_is_all_hits(order, ahead):
    source = Recording(len(order))
    p = Preloader(source, preloaded_data=ahead, order=np.array(order), threads=1)
    first = [p[i] for i in order]
    assert source.loads == list(order)
    after_one = p.stats()
    second = [p[i] for i in order]
    stats = p.stats()
    assert batches_equal(first, second) and batches_equal(first, [source[i] for i in order])
    assert stats["hits"] - after_one["hits"] == len(order)
    assert stats["loads"] == after_one["loads"] == len(order)
    assert stats["misses"] == 0  # the loader thread was ahead of every item, or waited for
    p.close()


@given(n=st.integers(0, 40), seed=st.integers(0, 2**64 - 1))
def test_own_sampler_shuffles_each_epoch_by_seed(n, seed):
    p = Preloader(list(range(n)), threads=0)
    one, two = p.sampler(shuffle=True, seed=seed), p.sampler(shuffle=True, seed=seed)
    epochs = [list(one) for _ in range(3)]
    assert [list(two) for _ in range(3)] == epochs  # deterministic per seed
    for epoch in epochs:
        assert sorted(epoch) == list(range(n))  # a permutation
    if n >= 8:
        assert epochs[0] != epochs[1]  # a new order every epoch
    assert list(p.sampler()) == list(range(n)) and len(one) == n
    one.set_epoch(0)
    assert list(one) == epochs[0]


def _loader_batches(dataset, **kwargs) -> list:
    return list(DataLoader(dataset, num_workers=0, **kwargs))


@pytest.mark.parametrize("batch_size", [1, 4, 5])
def test_wrapped_random_sampler_gives_its_batches_loading_in_sampled_order(batch_size):
    source, plain = Recording(23), Recording(23)
    p = Preloader(source, preloaded_data=4, threads=1)
    draws, hits = [], []
    for epoch in range(2):
        sampler = RandomSampler(plain, generator=torch.Generator().manual_seed(epoch))
        want = _loader_batches(plain, batch_size=batch_size, sampler=sampler)
        drawn = RandomSampler(source, generator=torch.Generator().manual_seed(epoch))
        planned = p.sampler(drawn)
        got = _loader_batches(p, batch_size=batch_size, sampler=planned)
        assert batches_equal(got, want)
        draws.append(plain.loads[-23:])
        hits.append(p.stats()["hits"])
    # The loads followed the sampled order; each item loaded once: epoch two was all hits.
    assert source.loads == draws[0]
    assert p.stats()["loads"] == 23 and p.stats()["misses"] == 0
    assert hits[1] - hits[0] == 23


def test_wrapped_batch_sampler_gives_its_batches_loading_in_sampled_order():
    source, plain = Recording(17), Recording(17)
    p = Preloader(source, preloaded_data=6, threads=1)

    def batch_sampler(dataset):
        random = RandomSampler(dataset, generator=torch.Generator().manual_seed(3))
        return BatchSampler(random, batch_size=4, drop_last=False)

    want = _loader_batches(plain, batch_sampler=batch_sampler(plain))
    got = _loader_batches(p, batch_sampler=p.sampler(batch_sampler(source)))
    assert batches_equal(got, want)
    assert source.loads == plain.loads


def test_batches_as_index_arrays_are_planned_too():
    source = Recording(12)
    p = Preloader(source, preloaded_data=4, threads=1)
    batches = [np.array([5, 1, 9]), torch.tensor([0, 11, 2]), [3, 4]]
    planned = p.sampler(batches)
    for batch in planned:
        p.__getitems__([int(i) for i in batch])
    assert source.loads == [5, 1, 9, 0, 11, 2, 3, 4]
    assert p.stats()["misses"] == 0


def test_expect_ignores_keys_it_cannot_cache():
    # Such keys used to enter the plan, and a thread called source[<the cache's marker>].
    source = Recording(6)
    want = [source[3], source[1]]
    source.loads.clear()
    p = Preloader(source, preloaded_data=4, threads=2)
    p.expect([slice(0, 2), 3, np.array([1, 2]), 1])
    assert batches_equal([p[3], p[1]], want)
    p.close()
    assert sorted(source.loads) == [1, 3]  # only the ints, loaded ahead
    assert p.stats()["misses"] == 0


def test_set_epoch_passes_through_to_a_distributed_sampler():
    source = list(range(20))
    p = Preloader(source, threads=0)
    planned = p.sampler(DistributedSampler(source, num_replicas=2, rank=1, seed=5))
    plain = DistributedSampler(source, num_replicas=2, rank=1, seed=5)
    for epoch in (0, 3):
        planned.set_epoch(epoch)
        plain.set_epoch(epoch)
        assert list(planned) == list(plain)
    assert planned.epoch == 3 and len(planned) == len(plain) == 10


def test_set_epoch_exists_only_where_the_inner_sampler_has_it():
    # Trainers call `sampler.set_epoch(e)` where `hasattr(sampler, "set_epoch")`; a wrapped
    # RandomSampler used to claim one and raise AttributeError when called.
    source = list(range(5))
    p = Preloader(source)
    for inner in (RandomSampler(source), SequentialSampler(source)):
        planned = p.sampler(inner)
        if hasattr(planned, "set_epoch"):
            planned.set_epoch(1)
        assert sorted(planned) == source
    assert not hasattr(p.sampler(RandomSampler(source)), "set_epoch")
    assert p.sampler(BatchSampler(source, 2, False)).batch_size == 2


# -- arguments -------------------------------------------------------------------------------


class _NoLength:
    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: Preloader(_NoLength()), "source"),
        (lambda: Preloader(iter([1, 2])), "source"),
        (lambda: Preloader([1, 2], order="abc"), "order"),
        (lambda: Preloader([1, 2], order=5), "order"),
        (lambda: Preloader([1, 2], order=[0, slice(0, 1)]), "order"),
        (lambda: Preloader([1, 2]).sampler(RandomSampler([1, 2]), shuffle=True), "shuffle"),
        (lambda: Preloader([1, 2]).sampler(5), "sampler"),
        (lambda: Preloader([1, 2]).sampler(shuffle=True, seed=-1), "seed"),
        (lambda: Preloader([1, 2], pin_memory="cuda"), "pin_memory"),
        (lambda: Preloader([1, 2], max_memory_size=-1), "max_memory_size"),
        (lambda: Preloader([1, 2], preloaded_data=-1), "preloaded_data"),
    ],
)
def test_bad_arguments_are_refused_naming_them(make, name):
    with pytest.raises(ArgumentError, match=name):
        make()


# -- pinned staging --------------------------------------------------------------------------


@pytest.mark.parametrize("pin_memory", [True, "torch", "jax", False])
def test_pin_memory_without_cuda_returns_items_unchanged(pin_memory):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU path")
    source = [torch.arange(4.0), {"x": np.ones(3, np.float32), "t": (torch.zeros(2),)}]
    p = Preloader(source, pin_memory=pin_memory)
    for _ in range(2):
        for i, value in enumerate(source):
            assert same_item(p[i], value)


@pytest.mark.gpu
def test_pin_memory_on_cuda_holds_pinned_tensors():
    source = [torch.arange(4.0), {"x": torch.ones(3)}]
    p = Preloader(source, pin_memory="torch", copy=False)
    held = [p[0], p[1]]
    assert held[0].is_pinned() and held[1]["x"].is_pinned()
    assert same_item(held[0], source[0]) and same_item(held[1], source[1])
    assert p[0] is held[0]  # copy=False: the held (pinned) tensor itself
