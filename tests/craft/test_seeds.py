"""Seeds, dtypes and constructor arguments are exact: refused when they cannot be honoured.

Seeds are ints in [0, 2**64) (NumPy ints too); every seed in range names its own weights and
rows, and bools, floats and out-of-range ints are refused rather than reduced. Parameters
take floating dtypes only. Dock layers and the EmbeddingStore refuse bools where ints are
expected and NaN/inf where finite numbers are, naming the argument.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import dualtrain
from dualtrain.craft import Craft, dock, reference_forward
from dualtrain.errors import ArgumentError, DtypeError
from dualtrain.validate import check_finite, check_int, check_seed


class Small(Craft):
    def __init__(self):
        super().__init__("SMALL")
        self.fc = dock.Dense(3, 2)

    def run(self, x):
        return self.fc(x)


seeds = st.integers(0, 2**64 - 1)
not_seeds = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(max_value=-1),
    st.integers(min_value=2**64),
    st.just(None),
    st.just("0"),
    st.builds(np.float64, st.floats(0, 10)),
    st.builds(np.bool_, st.booleans()),
)


@given(a=seeds, b=seeds)
def test_distinct_seeds_give_distinct_weights(a, b):
    wa, wb = Small().init(a)["fc.weight"], Small().init(b)["fc.weight"]
    assert np.array_equal(wa, wb) == (a == b)


def test_seed_zero_and_two_to_the_32_differ():
    craft = Small()
    assert not np.array_equal(craft.init(0)["fc.weight"], craft.init(2**32)["fc.weight"])
    store = lambda seed: dualtrain.EmbeddingStore(4, 2, seed=seed).table  # noqa: E731
    assert not np.array_equal(store(0), store(2**32))


def test_seeds_below_two_to_the_32_keep_their_weights():
    """The key layout is unchanged for seeds that were representable before."""
    w = Small().init(7)["fc.weight"]
    assert w.dtype == np.float32
    np.testing.assert_array_equal(w, Small().init(np.int64(7))["fc.weight"])
    np.testing.assert_array_equal(w, Small().init(np.uint32(7))["fc.weight"])


@given(bad=not_seeds)
def test_every_seed_argument_refuses_what_is_not_a_seed(bad):
    for make in (
        lambda: Small().init(bad),
        lambda: dualtrain.EmbeddingStore(4, 2, seed=bad),
        lambda: dualtrain.EmbeddingStore(4, 2).initialize(seed=bad if bad is not None else -1),
        lambda: reference_forward(Small(), Small().init(0), np.ones((1, 3)), seed=bad),
        lambda: check_seed("seed", bad),
    ):
        with pytest.raises(ArgumentError, match=r"seed must be an int in \[0, 2\*\*64\)"):
            make()


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("bad", [True, 1.0, -1, 2**64, np.float32(3)])
def test_realize_refuses_bad_seeds(framework, bad):
    realize = pytest.importorskip(f"dualtrain_{framework}.craft").realize
    with pytest.raises(ArgumentError, match="seed"):
        realize(Small(), seed=bad)


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8", "bool", "complex64", "str"])
def test_realize_refuses_non_float_dtypes(framework, dtype):
    # dtype=None is realize's default, float32 (tests/test_facades.py), no longer a refusal
    realize = pytest.importorskip(f"dualtrain_{framework}.craft").realize
    with pytest.raises(DtypeError, match="dtype must be one of"):
        realize(Small(), dtype=dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_realize_takes_every_float_dtype(dtype):
    torch = pytest.importorskip("torch")
    from dualtrain_torch.craft import realize

    module = realize(Small(), seed=3, dtype=dtype)
    assert module.fc.weight.dtype == getattr(torch, dtype)
    assert module.fc.weight.abs().sum() > 0
    assert realize(Small(), dtype=getattr(torch, dtype)).fc.weight.dtype == getattr(torch, dtype)


# ---- dock constructors ------------------------------------------------------------------

BAD_LAYERS = [
    ("momentum", lambda: dock.BatchNorm(4, momentum=None)),
    ("momentum", lambda: dock.BatchNorm(4, momentum=math.nan)),
    ("momentum", lambda: dock.BatchNorm(4, momentum=True)),
    ("eps", lambda: dock.BatchNorm(4, eps=math.inf)),
    ("eps", lambda: dock.LayerNorm(4, eps=math.nan)),
    ("eps", lambda: dock.LayerNorm(4, eps=None)),
    ("affine", lambda: dock.BatchNorm(4, affine=1)),
    ("num_features", lambda: dock.BatchNorm(True)),
    ("in_features", lambda: dock.Dense(True, 2)),
    ("bias", lambda: dock.Dense(2, 2, bias="yes")),
    ("kernel", lambda: dock.Conv(1, 1, True)),
    ("stride", lambda: dock.Conv(1, 1, 3, stride=(1, False))),
    ("padding", lambda: dock.Conv(1, 1, 3, padding=True)),
    ("padding", lambda: dock.Conv(1, 1, 3, padding=-1)),
    ("groups", lambda: dock.Conv(2, 2, 3, groups=True)),
    ("ndim", lambda: dock.Conv(1, 1, 3, ndim=True)),
    ("output_padding", lambda: dock.ConvTranspose(1, 1, 3, stride=2, output_padding=True)),
    ("padding", lambda: dock.MaxPool(3, padding=True)),
    ("kernel", lambda: dock.AvgPool(2.0)),
    ("p", lambda: dock.Dropout(None)),
    ("p", lambda: dock.Dropout(math.nan)),
    ("p", lambda: dock.Dropout(1.0)),
    ("shape", lambda: dock.LayerNorm((4, True))),
    ("shape", lambda: dock.Reshape((2, -1, -1))),
    ("shape", lambda: dock.Reshape((2, 1.5))),
    ("start", lambda: dock.Flatten(True)),
    ("start", lambda: dock.Flatten(1.0)),
    ("dim", lambda: dock.Embedding(4, True)),
]


@pytest.mark.parametrize(
    ("name", "make"), BAD_LAYERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_LAYERS)]
)
def test_dock_constructors_name_the_bad_argument(name, make):
    with pytest.raises(ArgumentError, match=rf"^{name} must be .*; got {name}="):
        make()


def test_dock_constructors_take_numpy_ints_as_ints():
    conv = dock.Conv(np.int64(2), np.int32(4), np.int64(3), padding=np.int64(1))
    assert conv.in_channels == 2 and type(conv.in_channels) is int
    assert conv.kernel == (3, 3) and all(type(k) is int for k in conv.kernel)
    assert conv.padding == 1 and type(conv.padding) is int
    assert dock.MaxPool(np.int64(2)).stride == (2, 2)
    assert dock.BatchNorm(4, momentum=np.float32(0.5)).momentum == 0.5


# ---- the store ----------------------------------------------------------------------------

BAD_STORES = [
    ("std", {"std": math.nan}),
    ("std", {"std": math.inf}),
    ("std", {"std": -1.0}),
    ("std", {"std": True}),
    ("std", {"std": "0.1"}),
    ("num_rows", {"num_rows": True}),
    ("dim", {"dim": 2.0}),
    ("pinned", {"pinned": 1}),
    ("init", {"init": "ones"}),
]


@pytest.mark.parametrize(
    ("name", "kw"), BAD_STORES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_STORES)]
)
def test_store_arguments_are_checked(name, kw):
    args = {"num_rows": 4, "dim": 2, **kw}
    with pytest.raises(ArgumentError, match=rf"^{name} must be .*; got {name}="):
        dualtrain.EmbeddingStore(**args)


def test_store_initialize_refuses_nan_std_and_keeps_the_table():
    store = dualtrain.EmbeddingStore(4, 2)
    before = store.table.copy()
    with pytest.raises(ArgumentError, match="std"):
        store.initialize("normal", std=math.nan)
    np.testing.assert_array_equal(store.table, before)


# ---- the shared validators --------------------------------------------------------------


@given(value=st.one_of(st.booleans(), st.floats(), st.text(max_size=2), st.none()))
def test_check_int_refuses_bools_floats_and_the_rest(value):
    with pytest.raises(ArgumentError, match=r"^n must be"):
        check_int("n", value)


@given(value=st.floats(allow_nan=True, allow_infinity=True))
def test_check_finite_refuses_exactly_nan_and_inf(value):
    if math.isfinite(value):
        assert check_finite("x", value) == value
    else:
        with pytest.raises(ArgumentError, match=r"^x must be a finite number"):
            check_finite("x", value)
