"""Tank laws: order, ranks, resumption, worker counts, and the errors of bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import ArgumentError
from dualtrain.fuel import Brighten, Comburant, Crop, Flip, FuelGenerator, Tank
from dualtrain.fuel.order import EpochOrder
from tests.fuel.raw import DTYPES, SPEC, make_folder

N = 23
AUGMENT = Comburant(Flip(), Crop(area=(0.5, 1.0)), Brighten(0.2))


def augment(sample: dict) -> dict:  # module level: worker processes pickle it
    return {**sample, "image": AUGMENT(sample["image"])}


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("raw")
    make_folder(str(folder), N)
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    return gen.generate(str(folder / "p.h5"), 12, 16, encode="PNG", shards=2, workers=0).paths


def stream(tank: Tank, count: int) -> list[dict]:
    return [tank.next() for _ in range(count)]


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], list):
                assert len(x[key]) == len(y[key])
                for u, v in zip(x[key], y[key], strict=True):
                    np.testing.assert_array_equal(u, v)
            else:
                np.testing.assert_array_equal(x[key], y[key])


@settings(max_examples=60)
@given(
    n=st.integers(1, 60), batch=st.integers(1, 16), world=st.integers(1, 4),
    shuffle=st.booleans(), full=st.booleans(), seed=st.integers(0, 2**40), epoch=st.integers(0, 5),
)  # fmt: skip
def test_ranks_partition_each_epoch_into_equal_disjoint_shares(
    n, batch, world, shuffle, full, seed, epoch
):
    if n < world:
        with pytest.raises(ArgumentError, match="world"):
            EpochOrder(n, batch, shuffle=shuffle, full=full, seed=seed, rank=0, world=world)
        return
    orders = [EpochOrder(n, batch, shuffle=shuffle, full=full, seed=seed, rank=r, world=world)
              for r in range(world)]  # fmt: skip
    share = n // world
    shares = [o.epoch(epoch)[:share] for o in orders]
    everything = np.concatenate(shares)
    assert len(set(everything.tolist())) == share * world  # disjoint, equal
    assert set(everything.tolist()) <= set(range(n))
    for o in orders:
        rows = o.epoch(epoch)
        batches = [o.batch(epoch, b) for b in range(o.batches)]
        np.testing.assert_array_equal(np.concatenate(batches), rows)
        if full:
            assert all(len(b) == batch for b in batches)
            if share >= batch:  # the filled last batch repeats no row
                assert len(set(batches[-1].tolist())) == batch
            assert set(rows.tolist()) == set(rows[:share].tolist())  # fill from the share
        else:
            assert len(rows) == share and all(len(b) == batch for b in batches[:-1])
    if not shuffle and world == 1:
        np.testing.assert_array_equal(shares[0], np.arange(n))


def test_epochs_differ_and_seeds_differ():
    a = EpochOrder(1000, 10, shuffle=True, full=True, seed=1, rank=0, world=1)
    b = EpochOrder(1000, 10, shuffle=True, full=True, seed=2, rank=0, world=1)
    assert not np.array_equal(a.epoch(0), a.epoch(1))
    assert not np.array_equal(a.epoch(0), b.epoch(0))
    np.testing.assert_array_equal(a.epoch(3), EpochOrder(
        1000, 10, shuffle=True, full=True, seed=1, rank=0, world=1).epoch(3))  # fmt: skip


def test_one_epoch_serves_every_row_once(pack):
    tank = Tank(pack, {"label": "int64", "name": "str"}, 5, in_same_size=False, seed=4)
    assert len(tank) == N and tank.batches_per_epoch == 5
    names = [name for batch in tank for name in batch["name"]]
    assert sorted(names) == sorted(f"item {i}" for i in range(N))
    assert tank.epoch == 1 and tank.position == 0
    second = [name for batch in tank for name in batch["name"]]
    assert sorted(second) == sorted(names) and second != names


def test_full_batches_wrap_and_short_batches_do_not(pack):
    full = Tank(pack, {"label": "int64"}, 10)
    assert full.batches_per_epoch == 3 and [len(b["label"]) for b in full] == [10, 10, 10]
    short = Tank(pack, {"label": "int64"}, 10, in_same_size=False)
    assert [len(b["label"]) for b in short] == [10, 10, 3]


@pytest.mark.slow
def test_worker_counts_and_modes_give_identical_batches(pack):
    ways = [
        {"workers": 0},
        {"workers": 1},
        {"workers": 4},
        {"workers": 2, "worker_mode": "process"},
    ]
    streams = []
    for way in ways:
        with Tank(pack, SPEC, 6, prep_fn=augment, seed=9, **way) as tank:
            streams.append(stream(tank, 9))  # crosses an epoch (MPE = 4)
    for other in streams[1:]:
        assert_same(streams[0], other)
    assert not np.array_equal(streams[0][0]["image"], streams[0][4]["image"])


@settings(max_examples=10)
@given(skip=st.integers(0, 12), workers=st.sampled_from([0, 2]))
def test_resume_from_any_state_continues_the_same_stream(pack, skip, workers):
    whole = stream(Tank(pack, SPEC, 5, prep_fn=augment, seed=2), 14)
    first = Tank(pack, SPEC, 5, prep_fn=augment, seed=2, workers=workers)
    stream(first, skip)
    state = first.state_dict()
    first.close()
    resumed = Tank(pack, SPEC, 5, prep_fn=augment, seed=2, workers=workers)
    resumed.load_state_dict(state)
    assert_same(stream(resumed, 14 - skip), whole[skip:])
    resumed.close()


def test_state_is_tiny_and_checked(pack):
    tank = Tank(pack, SPEC, 5, seed=2)
    tank.next()
    state = tank.state_dict()
    assert state["epoch"] == 0 and state["position"] == 1 and len(state) == 11
    other = Tank(pack, SPEC, 4, seed=2)
    with pytest.raises(ArgumentError, match="batch_size"):
        other.load_state_dict(state)
    with pytest.raises(ArgumentError, match="seed"):
        Tank(pack, SPEC, 5, seed=3).load_state_dict(state)
    with pytest.raises(ArgumentError, match="position"):
        tank.load_state_dict({**state, "position": 99})


def test_custom_fetch_prep_and_collate(pack):
    def fetch(data, index):
        return {"raw": data["image"][index], "label": data["label"][index]}

    def collate(samples):
        return [s["label"] for s in samples], sum(len(s["raw"]) for s in samples)

    tank = Tank(pack, {"label": "int64"}, 4, shuffle=False, fetch_fn=fetch, collate_fn=collate)
    labels, nbytes = tank.next()
    assert labels == [0, 1, 2, 3] and nbytes > 0


def test_errors_in_prep_fn_name_the_row(pack):
    def boom(sample):
        raise RuntimeError("bad sample")

    for workers in (0, 2):
        tank = Tank(pack, SPEC, 4, shuffle=False, prep_fn=boom, workers=workers)
        with pytest.raises(RuntimeError, match="bad sample") as e:
            tank.next()
        assert any("row 0 of epoch 0" in note for note in e.value.__notes__)
        tank.close()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1; got batch_size=0"),
        ({"workers": -1}, "workers"),
        ({"to": "tensorflow"}, "to must be one of"),
        ({"data_specf": {"nope": "int64"}}, "data_specf"),
        ({"data_specf": {"label": "int65"}}, "data_specf"),
        ({"data_specf": {"image": "float32"}}, "'uint8' for an image column"),
        ({"world": 2, "rank": 2}, "rank"),
        ({"worker_mode": "fiber"}, "worker_mode"),
        ({"data_path": "missing.h5"}, "data_path"),
        ({"data_path": "list.csv"}, "data_path"),
        ({"device": "cpu"}, "device"),
        ({"prep_fn": 3}, "prep_fn"),
    ],
)
def test_bad_arguments_are_named(pack, kwargs, says):
    args = {"data_path": pack, "data_specf": SPEC, "batch_size": 4, **kwargs}
    with pytest.raises(ArgumentError, match=says):
        Tank(**args)
