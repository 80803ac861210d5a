"""Craft and dock in the core: naming, tying, initialization, padding, errors. NumPy only."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import dualtrain
from dualtrain.craft import Craft, NotRealizedError, autopad, dock, reference_forward


class Block(Craft):
    def __init__(self, width):
        super().__init__()
        self.fc = dock.Dense(width, width)
        self.norm = dock.LayerNorm(width)

    def run(self, x):
        return self.norm(dock.relu(self.fc(x)))


class Net(Craft):
    def __init__(self):
        super().__init__("NET")
        self.embed = dock.Embedding(10, 4)
        self.blocks = [Block(4), Block(4)]
        self.heads = {"a": dock.Dense(4, 2), "b": dock.Dense(4, 3)}
        self.seq = dock.Sequential(dock.Dense(4, 4), dock.Dropout(0.1))
        self.tied = self.heads["a"]
        self.not_a_layer = 3

    def run(self, ids):
        x = self.seq(self.embed(ids).mean(axis=1))
        for block in self.blocks:
            x = block(x)
        return self.heads["a"](x), self.tied(x), self.heads["b"](x)


def test_names_follow_attributes_lists_dicts_and_sequential():
    assert list(Net().param_specs()) == [
        "embed.weight",
        "blocks.0.fc.weight", "blocks.0.fc.bias", "blocks.0.norm.weight", "blocks.0.norm.bias",
        "blocks.1.fc.weight", "blocks.1.fc.bias", "blocks.1.norm.weight", "blocks.1.norm.bias",
        "heads.a.weight", "heads.a.bias", "heads.b.weight", "heads.b.bias",
        "seq.0.weight", "seq.0.bias",
    ]  # fmt: skip


def test_a_layer_used_twice_is_one_layer():
    net = Net()
    names = net.layer_names()
    assert names[id(net.tied)] == "heads.a"
    out_a, out_tied, _ = reference_forward(net, net.init(0, "float64"), np.array([[1, 2]]))[0]
    np.testing.assert_array_equal(out_a, out_tied)


@given(seed=st.integers(0, 2**31))
def test_same_seed_same_weights_and_different_names_different_streams(seed):
    a, b = Net().init(seed), Net().init(seed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["heads.a.weight"][:2, :2], a["heads.b.weight"][:2, :2])
    assert dualtrain.is_aligned(a["embed.weight"])


def test_initial_values_follow_the_documented_scheme():
    values = Net().init(0, "float64")
    bound = 1 / np.sqrt(4)
    assert np.abs(values["blocks.0.fc.weight"]).max() <= bound
    assert np.array_equal(values["blocks.0.norm.weight"], np.ones(4))
    assert np.array_equal(values["blocks.0.norm.bias"], np.zeros(4))
    assert values["embed.weight"].std() > 0.5  # N(0, 1)


def test_a_craft_runs_only_inside_a_realized_module():
    with pytest.raises(NotRealizedError, match="realize"):
        Net()(np.array([[1]]))
    with pytest.raises(NotRealizedError, match="realize"):
        dock.Dense(2, 2)(np.ones((1, 2)))


def test_reference_forward_reports_new_batchnorm_state():
    class BN(Craft):
        def __init__(self):
            super().__init__()
            self.bn = dock.BatchNorm(3, momentum=0.5)

        def run(self, x):
            return self.bn(x)

        # a layer created in run is not registered: calling it is an error

    x = np.random.default_rng(0).normal(2.0, 1.0, size=(8, 3))
    craft = BN()
    _, state = reference_forward(craft, craft.init(0, "float64"), x, train=True)
    np.testing.assert_allclose(state["bn.running_mean"], 0.5 * x.mean(0))
    np.testing.assert_allclose(state["bn.running_var"], 0.5 + 0.5 * x.var(0, ddof=1))


def test_unregistered_layers_are_refused():
    class Sneaky(Craft):
        def run(self, x):
            return dock.Dense(2, 2)(x)

    with pytest.raises(NotRealizedError, match="not an attribute"):
        reference_forward(Sneaky(), {}, np.ones((1, 2)))


@given(
    size=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    data=st.data(),
)
def test_autopad_keeps_the_size_at_stride_one_and_ceil_otherwise(size, data):
    nd = len(size)
    kernel = tuple(data.draw(st.integers(1, 7)) for _ in range(nd))
    stride = tuple(data.draw(st.integers(1, 3)) for _ in range(nd))
    dilation = tuple(data.draw(st.integers(1, 3)) for _ in range(nd))
    pads = autopad(tuple(size), kernel, stride, dilation)
    for n, k, s, d, (lo, hi) in zip(size, kernel, stride, dilation, pads, strict=True):
        out = (n + lo + hi - d * (k - 1) - 1) // s + 1
        assert out == -(-n // s)
        assert 0 <= hi - lo <= 1


def test_autopad_orders_axes_like_the_input():
    # Nebulae returned (w, h) for non-square kernels; a (3, 5) kernel on 32x40 must keep 32x40.
    assert autopad((32, 40), (3, 5)) == ((1, 1), (2, 2))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: dock.Dense(0, 3), "in_features must be a positive int; got in_features=0"),
        (lambda: dock.Conv(3, 4, kernel=0), "kernel must be a positive int or 2 positive ints"),
        (lambda: dock.Conv(3, 4, 3, groups=2), "groups must be a divisor"),
        (lambda: dock.Conv(3, 4, 3, padding="full"), "padding must be 'same', 'valid'"),
        (
            lambda: dock.MaxPool(2, padding=2),
            "padding must be a non-negative int, or 2 of them, each at most kernel/2",
        ),
        (
            lambda: dock.MaxPool((2, 2), padding=((0, 0), (0, 0))),
            "not (low, high) pairs: pad first with dock.pad(x, pairs, value)",
        ),
        (lambda: dock.Dropout(1.0), "p must be a float in [0, 1); got p=1.0"),
        (lambda: dock.BatchNorm(4, momentum=2), "momentum must be a float in [0, 1]"),
        (lambda: dock.Embedding(10, -1), "dim must be a positive int"),
        (lambda: dock.Conv(3, 4, kernal=3), "unexpected keyword argument 'kernal'"),
        (lambda: dock.Conv(3, 4, (3, 3), ndim=3), "kernel must be 3 sizes"),
    ],
)
def test_bad_layer_arguments_are_named(make, message):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("layer", "x", "message"),
    [
        (
            dock.Conv(3, 4, 3),
            np.ones((2, 3, 8)),
            "Conv takes (N, C, 2 spatial axes), rank 4; got shape (2, 3, 8)",
        ),
        (
            dock.Conv(3, 4, 3),
            np.ones((2, 5, 8, 8)),
            "Conv takes 3 channels on axis 1; got shape (2, 5, 8, 8)",
        ),
        (dock.Dense(4, 2), np.ones((2, 3)), "Dense takes (..., 4); got shape (2, 3)"),
        (dock.BatchNorm(4), np.ones((2, 3)), "BatchNorm takes 4 channels"),
        (dock.Embedding(4, 2), np.ones((2, 3)), "Embedding takes integer ids; got dtype float64"),
    ],
)
def test_bad_inputs_are_named(layer, x, message):
    class One(Craft):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def run(self, x):
            return self.layer(x)

    craft = One()
    with pytest.raises(dualtrain.DualtrainError) as info:
        reference_forward(craft, craft.init(0, "float64"), x)
    assert message in str(info.value)
