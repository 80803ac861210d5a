"""The core EmbeddingStore: initialization laws, id checks, memory report, bad arguments."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

import dualtrain
from dualtrain.embeddings import BLOCK, lookup
from dualtrain.errors import ArgumentError, DtypeError
from tests.helpers import CHILD_TIMEOUT_S


@given(st.integers(1, 3 * BLOCK), st.integers(1, 3 * BLOCK), st.integers(0, 2**32))
def test_rows_depend_on_seed_and_row_only(rows_a, rows_b, seed):
    a = dualtrain.EmbeddingStore(rows_a, 3, seed=seed)
    b = dualtrain.EmbeddingStore(rows_b, 3, seed=seed)
    n = min(rows_a, rows_b)
    np.testing.assert_array_equal(a.table[:n], b.table[:n])


@pytest.mark.parametrize("init", ["normal", "uniform"])
def test_init_statistics(init):
    store = dualtrain.EmbeddingStore(20_000, 16, init=init, std=0.5, seed=3)
    assert abs(store.table.std() - 0.5) < 0.01 and abs(store.table.mean()) < 0.01
    if init == "uniform":
        assert np.abs(store.table).max() <= np.sqrt(3) * 0.5


def test_callable_init_and_zeros():
    store = dualtrain.EmbeddingStore(10, 2, init=lambda rows, rng: np.stack([rows, -rows], 1))
    np.testing.assert_array_equal(store.table[:, 0], np.arange(10))
    assert not dualtrain.EmbeddingStore(5, 2, init="zeros").table.any()


@given(st.lists(st.lists(st.integers(0, 49), max_size=30), min_size=1, max_size=3))
def test_lookup_is_unique_plus_inverse(parts):
    arrays = tuple(np.array(p, np.int64) for p in parts)
    found = lookup(arrays, 50)
    assert np.all(np.diff(found.unique) > 0)
    for given_ids, inverse in zip(arrays, found.parts, strict=False):
        np.testing.assert_array_equal(found.unique[inverse], given_ids)


@pytest.mark.parametrize(
    ("ids", "error", "text"),
    [
        (np.array([1, -1]), ArgumentError, "row id -1 at position (1,)"),
        (np.array([[0, 1], [7, 2]]), ArgumentError, "row id 7 at position (1, 0)"),
        (np.array([0.0, 1.0]), DtypeError, "dtype float64"),
        (np.array([True]), DtypeError, "dtype bool"),
    ],
)
def test_bad_ids_are_named(ids, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        lookup((ids,), 7)


def test_memory_report_counts_table_state_and_counters():
    store = dualtrain.EmbeddingStore(100, 8)
    store.allocate_state({"m": np.zeros(8, np.float32)}, counters=True)
    report = store.memory()
    assert report.table == report.state["m"] == 100 * 8 * 4
    assert report.counters == 800 and report.per_row == 32 + 32 + 8


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_rows": 0}, "num_rows"),
        ({"dim": 2.5}, "dim"),
        ({"dtype": "int8"}, "dtype"),
        ({"init": "ones"}, "init"),
        ({"std": -1.0}, "std"),
        ({"pinned": "yes"}, "pinned"),
    ],
)
def test_bad_arguments_are_named(kwargs, name):
    args = {"num_rows": 10, "dim": 4, **kwargs}
    with pytest.raises(ArgumentError, match=name):
        dualtrain.EmbeddingStore(**args)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available(),
    reason="CUDA present: pinning is allowed",
)
def test_pinned_needs_cuda_here():
    with pytest.raises(ArgumentError, match="pinned"):
        dualtrain.EmbeddingStore(10, 4, pinned=True)


def test_store_imports_no_framework():
    code = (
        "import dualtrain, sys; dualtrain.EmbeddingStore(10, 4); "
        "print('torch' in sys.modules, 'jax' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        timeout=CHILD_TIMEOUT_S,
    )  # fmt: skip
    assert out.stdout.split() == ["False", "False"]
