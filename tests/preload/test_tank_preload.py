"""A Tank with ``preload=`` serves exactly the batches it serves without, within its budget."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import ArgumentError
from dualtrain.fuel import FuelGenerator, Tank
from dualtrain.fuel.order import EpochOrder
from tests.fuel.raw import DTYPES, SPEC, make_folder
from tests.preload.workers_data import augment, fetch_augmented

N = 23
ARRAYS = {"image": "uint8", "label": "int64", "box": "float32"}  # what every framework takes


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("raw")
    make_folder(str(folder), N)
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    return gen.generate(str(folder / "p.h5"), 12, 16, encode="PNG", shards=2, workers=0).paths


@pytest.fixture(scope="module")
def row_bytes(pack):
    """The cache's byte count of one decoded row (every row decodes to one image size)."""
    with Tank(pack, SPEC, 1, shuffle=False, preload={"threads": 0}) as tank:
        tank.next()
        return tank.preloader.stats()["local_bytes"]


def serve(tank: Tank, count: int) -> list:
    with tank:
        return [tank.next() for _ in range(count)]


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], list):
                assert len(x[key]) == len(y[key])
                for u, v in zip(x[key], y[key], strict=True):
                    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
            else:
                np.testing.assert_array_equal(np.asarray(x[key]), np.asarray(y[key]))


def preloads(row_bytes: int):
    budgets = st.integers(0, (N + 2) * row_bytes)
    return st.one_of(
        st.just(True),
        budgets,
        st.fixed_dictionaries(
            {"max_memory_size": budgets},
            optional={
                "preloaded_data": st.integers(0, 30),
                "threads": st.integers(0, 3),
                "copy": st.booleans(),
            },
        ),
    )


@settings(max_examples=25)
@given(
    data=st.data(), workers=st.sampled_from([0, 2]), shuffle=st.booleans(),
    batch=st.integers(1, 9), full=st.booleans(), seed=st.integers(0, 2**40),
)  # fmt: skip
def test_preload_serves_exactly_the_batches_served_without(
    pack, row_bytes, data, workers, shuffle, batch, full, seed
):
    preload = data.draw(preloads(row_bytes), label="preload")
    args = {"shuffle": shuffle, "in_same_size": full, "prep_fn": augment, "seed": seed}
    args["workers"] = workers
    plain = Tank(pack, SPEC, batch, **args)
    count = 3 * plain.batches_per_epoch  # three epochs
    want = serve(plain, count)
    cached = Tank(pack, SPEC, batch, preload=preload, **args)
    assert_same(serve(cached, count), want)
    stats = cached.preloader.stats()
    assert stats["peak_resident_bytes"] <= stats["max_memory_size"]
    assert stats["resident_bytes"] <= stats["max_memory_size"]


def test_augmentation_still_differs_between_epochs(pack):
    with Tank(pack, SPEC, N, shuffle=False, prep_fn=augment, preload=True) as tank:
        first, second = tank.next(), tank.next()
    np.testing.assert_array_equal(first["label"], second["label"])  # the same rows
    assert not np.array_equal(first["image"], second["image"])  # drawn again


@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_after_the_first_are_all_hits_when_the_pack_fits(pack, workers):
    with Tank(pack, SPEC, 5, prep_fn=augment, workers=workers, preload=True) as tank:
        per_epoch = tank.samples_per_epoch
        for _ in range(tank.batches_per_epoch):
            tank.next()
        before = tank.preloader.stats()
        for _ in range(2 * tank.batches_per_epoch):
            tank.next()
        after = tank.preloader.stats()
    assert after["loads"] == N  # every row decoded once
    assert after["evictions"] == 0 and after["items"] == N
    # Every get that was not a hit came in the first epoch (worker threads prepare the
    # batches after the one served ahead, so a snapshot can fall inside an epoch).
    assert after["misses"] + after["prefetch_waits"] <= per_epoch
    assert after["hits"] >= 2 * per_epoch
    if workers == 0:  # the snapshots fall between epochs: hit rate 1 over epochs 2 and 3
        assert after["hits"] - before["hits"] == 2 * per_epoch
        assert after["misses"] == before["misses"]
        assert after["prefetch_waits"] == before["prefetch_waits"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_preloading_tank_walks_its_order_once(pack, workers, monkeypatch):
    """One look-ahead: the cache loads the rows the pipeline planned, not a walk of its own.

    Each batch is planned once, in serving order, whatever reads ahead of it (the pipeline's
    workers, the cache's loader threads); two walks planned the coming batches again at
    every step, the cache's several batches ahead of the pipeline's.
    """
    planned: list[tuple[int, int]] = []
    batch = EpochOrder.batch

    def counted(order: EpochOrder, epoch: int, number: int) -> np.ndarray:
        planned.append((epoch, number))
        return batch(order, epoch, number)

    monkeypatch.setattr(EpochOrder, "batch", counted)
    with Tank(pack, SPEC, 5, prep_fn=augment, workers=workers, preload=True) as tank:
        served = 3 * tank.batches_per_epoch
        for _ in range(served):
            tank.next()
        ahead = tank.preloader.preloaded_data // 5 + 1  # batches planned past the last served
        stats = tank.preloader.stats()
    assert len(planned) == len(set(planned)) and planned == sorted(planned)
    assert served <= len(planned) <= served + ahead
    assert stats["loads"] == N  # each row read once, ahead or by the worker that asked first


@pytest.mark.parametrize("workers", [0, 2])
def test_a_budget_smaller_than_the_pack_is_never_exceeded(pack, row_bytes, workers):
    budget = 7 * row_bytes + row_bytes // 2
    args = {"prep_fn": augment, "workers": workers, "seed": 5}
    want = serve(Tank(pack, SPEC, 4, **args), 18)
    tank = Tank(pack, SPEC, 4, preload=budget, **args)
    assert_same(serve(tank, 18), want)
    stats = tank.preloader.stats()
    assert stats["max_memory_size"] == budget
    assert stats["peak_resident_bytes"] <= budget and stats["items"] <= 7
    assert stats["loads"] > N  # some rows were decoded again: they could not all stay


@pytest.mark.parametrize("to", ["jax", "torch"])
def test_framework_batches_with_preload_equal_those_without(pack, to):
    pytest.importorskip(to)
    args = {"prep_fn": augment, "seed": 3, "to": to}
    want = serve(Tank(pack, ARRAYS, 6, **args), 9)
    got = serve(Tank(pack, ARRAYS, 6, preload=True, **args), 9)
    assert type(got[0]["image"]) is type(want[0]["image"])
    assert_same(got, want)


@pytest.mark.slow
def test_process_workers_with_preload_serve_the_same_batches(pack):
    args = {"prep_fn": augment, "seed": 9, "workers": 2, "worker_mode": "process"}
    want = serve(Tank(pack, SPEC, 6, prep_fn=augment, seed=9), 12)
    tank = Tank(pack, SPEC, 6, preload=True, **args)
    assert_same(serve(tank, 12), want)
    stats = tank.preloader.stats()
    # The workers share one folder: rows are loaded about once (two processes asking for one
    # row at the same moment both load it: loads are not shared across processes).
    assert N <= stats["loads"] < 2 * N and stats["hits"] >= tank.samples_per_epoch
    assert stats["resident_bytes"] <= stats["max_memory_size"]


@settings(max_examples=10)
@given(skip=st.integers(0, 12), workers=st.sampled_from([0, 2]))
def test_resume_with_preload_continues_the_same_stream(pack, row_bytes, skip, workers):
    args = {"prep_fn": augment, "seed": 2, "workers": workers}
    whole = serve(Tank(pack, SPEC, 5, **args), 14)
    first = Tank(pack, SPEC, 5, preload=10 * row_bytes, **args)
    with first:
        for _ in range(skip):
            first.next()
        state = first.state_dict()
    resumed = Tank(pack, SPEC, 5, preload=10 * row_bytes, **args)
    resumed.load_state_dict(state)
    assert_same(serve(resumed, 14 - skip), whole[skip:])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_random_draw_in_fetch_fn_is_refused_with_preload(pack, workers):
    spec = {"image": "uint8", "label": "int64"}
    with Tank(pack, spec, 4, fetch_fn=fetch_augmented, workers=workers) as tank:
        tank.next()  # without preload the draw is fine
    tank = Tank(pack, spec, 4, fetch_fn=fetch_augmented, workers=workers, preload=True)
    with tank, pytest.raises(ArgumentError, match="prep_fn"):
        tank.next()


@pytest.mark.parametrize(
    "preload",
    ["yes", -1, 1.5, [1], {"bogus": 1}, {"max_memory_size": -1}, {"threads": "two"},
     {"preloaded_data": -3}, {"sizeof": 3}],
)  # fmt: skip
def test_bad_preload_values_are_named(pack, preload):
    with pytest.raises(ArgumentError, match=r"^preload must be .*got preload="):
        Tank(pack, SPEC, 4, preload=preload)


def test_preload_off_leaves_no_cache(pack):
    for off in (False, None):
        with Tank(pack, SPEC, 4, preload=off) as tank:
            assert tank.preloader is None


def test_a_numpy_int_budget_is_taken(pack):
    with Tank(pack, ARRAYS, 4, preload=np.int64(1 << 20)) as tank:
        tank.next()
        assert tank.preloader.stats()["max_memory_size"] == 1 << 20


@pytest.mark.parametrize("copy", [True, False])
def test_layout_scale_and_a_prep_fn_setting_keys_never_change_the_held_rows(pack, copy):
    # The Tank's finish step and a prep_fn write keys of the sample: with copy=False they
    # wrote into the held dict, so later epochs got NCHW of NCHW and images scaled twice.
    def prep(sample):
        sample["image"] = sample["image"][::-1]
        return sample

    settings_ = {"layout": "NCHW", "scale": {"image": 1 / 255}, "prep_fn": prep, "seed": 4}
    plain = serve(Tank(pack, ARRAYS, 5, **settings_), 15)
    tank = Tank(pack, ARRAYS, 5, preload={"max_memory_size": 1 << 20, "copy": copy}, **settings_)
    assert_same(plain, serve(tank, 15))
    from dualtrain.preload import nbytes

    held = sum(nbytes(e.item) for e in tank.preloader._items.values())
    assert tank.preloader.stats()["resident_bytes"] == held


def _regenerate(paths):
    """The pack made again from the same files with their pixels inverted."""
    from PIL import Image

    from tests.fuel.raw import picture

    folder = paths[0].rsplit("/", 1)[0]
    for i in range(N):
        Image.fromarray(255 - picture(i, 20, 24)).save(f"{folder}/{i}.png")
    gen = FuelGenerator(file_dir=folder, file_list=f"{folder}/list.csv", dtype=DTYPES)
    return gen.generate(f"{folder}/p.h5", 12, 16, encode="PNG", shards=2, workers=0).paths


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pack_replaced_while_closed_is_read_anew_not_served_from_the_cache(tmp_path, workers):
    folder = tmp_path / "raw"
    folder.mkdir()
    make_folder(str(folder), N)
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    paths = gen.generate(str(folder / "p.h5"), 12, 16, encode="PNG", shards=2, workers=0).paths
    plain = Tank(paths, ARRAYS, 8, shuffle=False, workers=workers)
    cached = Tank(paths, ARRAYS, 8, shuffle=False, workers=workers, preload=1 << 20)
    for _ in range(3):  # the whole pack, cached
        plain.next(), cached.next()
    plain.close(), cached.close()
    assert _regenerate(paths) == paths  # new pixels, same files (renamed into place)
    assert_same([plain.next() for _ in range(6)], [cached.next() for _ in range(6)])
    plain.close(), cached.close()
