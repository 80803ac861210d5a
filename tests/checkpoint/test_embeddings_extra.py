"""drop_embeddings checks `extra` as TimeMachine.drop does: what it writes loads back as given.

It stored a value JSON cannot hold as its repr (a str on load) and an int key as a str key.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import ArgumentError, EmbeddingStore, TimeMachine

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402


def _rows(framework: str):
    store = EmbeddingStore(16, 2, seed=1)
    if framework == "torch":
        return dualtrain_torch.attach(store, torch.optim.SGD, lr=0.1)
    return dualtrain_jax.attach(store, optax.sgd(0.1))


BAD = {
    "int key": {1: "a"},
    "nested int key": {"a": [{"b": 1, 2: 3}]},
    "an object": {"a": object()},
    "a set": {"a": {1, 2}},
    "bytes": {"a": b"x"},
    "an array": {"a": np.zeros(2)},
    "not a dict": [("a", 1)],
}


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_an_extra_that_would_not_load_as_given_is_refused_and_nothing_written(
    tmp_path, framework, case
):
    with pytest.raises(ArgumentError, match="extra"):
        TimeMachine(save_path=tmp_path).drop_embeddings(_rows(framework), "emb", extra=BAD[case])
    assert os.listdir(tmp_path) == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@pytest.mark.parametrize("framework", ["torch", "jax"])
@settings(max_examples=15)
@given(extra=st.dictionaries(st.text(max_size=4), JSON, max_size=4))
def test_what_drop_embeddings_accepts_loads_back_as_given(tmp_path_factory, framework, extra):
    folder = tmp_path_factory.mktemp("emb")
    tm = TimeMachine(save_path=folder)
    tm.drop_embeddings(_rows(framework), "emb", extra=extra)
    assert tm.to_embeddings(_rows(framework), "emb")["extra"] == extra
