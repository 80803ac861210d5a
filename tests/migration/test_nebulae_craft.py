"""Nebulae's Astro and Cockpit checkpoint parts as its brochure shows them (issue 18, items 3-4).

The brochure's `NetNeb`/`NetTorch` classes realize and train; `Rudder()`, `Prober()`,
`Nozzle()` work as bare contexts; `coat`/`shell` keep its defaults; `autoPad` (its home in
`dualtrain.craft.padding`; Nebulae's own in the compat namespace) returns the flat ``F.pad``
tuple; `TimeMachine` takes its arguments. Laws: autoPad gives "same" sizes through ``F.pad``
and a convolution, and is `autopad` flattened last axis first.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import given, strategies as st

import dualtrain
from dualtrain import Craft, DtypeError, TimeMachine, autopad, dock
from dualtrain.craft.padding import autoPad  # the flat form's home (compat builds on it)
from dualtrain.errors import ArgumentError, CheckpointError

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy
F = torch.nn.functional
import dualtrain_jax  # noqa: E402
import dualtrain_torch  # noqa: E402

# ---- the brochure's two networks (its `super(Net, self)` names a class it never defines) ----


class NetNeb(Craft):
    def __init__(self, nclass, scope="NEB"):
        super(NetNeb, self).__init__(scope)  # noqa: UP008 - the brochure's spelling
        self.flat = dock.Reshape()
        self.fc = dock.Dense(512, nclass)

    def run(self, x):
        x = self.flat(x, (-1, 512))
        y = self.fc(x)
        return y


class NetTorch(Craft):
    def __init__(self, nclass, scope="TORCH"):
        super(NetTorch, self).__init__(scope)  # noqa: UP008 - the brochure's spelling
        self.fc = torch.nn.Linear(512, nclass)

    def run(self, x):
        x = x.view(-1, 512)
        y = self.fc(x)
        return y


def _batch(seed=0, n=8):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 2, 16, 16)).astype("float32"), rng.integers(0, 10, n)


def test_dock_craft_is_the_craft_with_a_warning_naming_the_new_paths():
    with pytest.warns(DeprecationWarning, match="use dualtrain.Craft .*compat.nebulae"):
        assert dock.Craft is Craft is dualtrain.Craft
    assert NetNeb(10).scope == "NEB" and NetTorch(10).scope == "TORCH"


@pytest.mark.parametrize("kind", [NetNeb, NetTorch])
def test_brochure_networks_realize_and_train_under_torch(kind):
    from dualtrain_torch import Nozzle, Rudder, coat, realize, shell

    net = realize(kind(10), seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x, y = _batch()
    x, y = coat(x), coat(y)
    losses = []
    for _ in range(5):
        with Rudder():
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(shell(loss))
    assert isinstance(losses[0], float) and losses[-1] < losses[0]
    with Nozzle():
        assert shell(net(x)).shape == (8, 10)
        assert not net(x).requires_grad


def test_netneb_trains_under_jax_from_the_same_weights_as_torch():
    optax = pytest.importorskip("optax")
    x, y = _batch()
    tnet = dualtrain_torch.realize(NetNeb(10), seed=3)
    jnet = dualtrain_jax.realize(NetNeb(10), seed=3)
    with dualtrain_torch.Nozzle(), dualtrain_jax.Nozzle():
        same = np.allclose(
            dualtrain_torch.shell(tnet(dualtrain_torch.coat(x))),
            dualtrain_jax.shell(jnet(dualtrain_jax.coat(x))),
            atol=1e-5,
        )
    assert same

    def loss_fn(params, x, y):
        out, _ = jnet.apply(params, jnet.state, x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(out, y).mean()

    opt = optax.sgd(0.05)
    state = opt.init(jnet.params)
    xj, yj = dualtrain_jax.coat(x), dualtrain_jax.coat(y)
    losses = []
    with dualtrain_jax.Rudder(jnet):
        for _ in range(5):
            loss, grads = jax.value_and_grad(loss_fn)(jnet.params, xj, yj)
            updates, state = opt.update(grads, state)
            jnet.params = optax.apply_updates(jnet.params, updates)
            losses.append(dualtrain_jax.shell(loss))
    assert losses[-1] < losses[0]


# ---- Rudder / Prober / Nozzle as bare contexts (the brochure's form) and with modules ----


@pytest.mark.parametrize(
    ("name", "grad", "value"),
    [("Rudder", True, True), ("Prober", True, False), ("Nozzle", False, False)],
)
def test_bare_contexts_set_grad_mode_and_answer_like_nebulae(name, grad, value):
    context = getattr(dualtrain_torch, name)
    net = dualtrain_torch.realize(NetNeb(10))
    net.train()
    with torch.no_grad() if grad else torch.enable_grad():
        with context() as answer:
            assert torch.is_grad_enabled() is grad
            assert answer is value  # Nebulae's `net.gear(rudder)`: True trains
            assert net.training  # no module given: train/eval left as it was
        assert torch.is_grad_enabled() is not grad
    with context(net):
        assert net.training is value  # ours: the modules given follow the mode
    assert net.training
    jnet = dualtrain_jax.realize(NetNeb(10))
    with getattr(dualtrain_jax, name)() as answer:
        assert answer is value and jnet.train is False
    with getattr(dualtrain_jax, name)(jnet):
        assert jnet.train is value


def test_prober_computes_input_gradients_without_touching_parameters():
    from dualtrain_torch import Prober, coat, realize

    net = realize(NetNeb(10))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = coat(_batch()[0], as_const=False)
    with torch.no_grad(), Prober():
        net(x).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


# ---- coat / shell with the brochure's defaults ----


@pytest.mark.parametrize("adapter", [dualtrain_torch, dualtrain_jax])
def test_coat_and_shell_have_the_brochure_signatures(adapter):
    coat = inspect.signature(adapter.coat).parameters
    shell = inspect.signature(adapter.shell).parameters
    assert list(coat)[:2] == ["datum", "as_const"] and coat["as_const"].default is True
    assert list(shell)[:2] == ["datum", "as_np"] and shell["as_np"].default is True


@given(
    values=st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=6),
    as_int=st.booleans(),
)
def test_shell_of_coat_gives_the_values_back_in_both(values, as_int):
    data = np.array(values, dtype="float32")
    data = data.astype("int32") if as_int else data
    for adapter in (dualtrain_torch, dualtrain_jax):
        out = adapter.coat(data)  # default as_const=True: a constant
        assert not getattr(out, "requires_grad", False)
        back = adapter.shell(out)  # default as_np=True: NumPy
        assert isinstance(back, np.ndarray) and back.dtype == data.dtype
        np.testing.assert_array_equal(back, data)
    trainable = dualtrain_torch.coat(data.astype("float32"), as_const=False)
    assert trainable.requires_grad and trainable.is_leaf


@pytest.mark.parametrize("adapter", [dualtrain_torch, dualtrain_jax])
def test_coat_refuses_a_trainable_integer_and_a_non_bool_as_const(adapter):
    with pytest.raises(DtypeError, match=r"as_const=False.*floating; got int"):
        adapter.coat([1, 2], as_const=False)  # torch raised a bare RuntimeError
    with pytest.raises(ArgumentError, match="as_const must be a bool"):
        adapter.coat([1.0], as_const="no")
    out = adapter.coat([1, 2], as_const=False, dtype="float32")
    assert str(out.dtype).removeprefix("torch.") == "float32"


def test_torch_coat_takes_numpy_and_torch_dtypes():
    # getattr(torch, str(np.float32)) failed: NumPy dtypes name themselves "<class ...>".
    assert dualtrain_torch.coat(3, dtype=np.float32).dtype == torch.float32
    assert dualtrain_torch.coat(3, dtype=torch.float16).dtype == torch.float16
    assert dualtrain_torch.coat([1], dtype="bfloat16").dtype == torch.bfloat16


# ---- autoPad: the brochure's flat tuple ----

_FUNCS = {1: (F.conv1d, F.max_pool1d), 2: (F.conv2d, F.max_pool2d), 3: (F.conv3d, F.max_pool3d)}


@st.composite
def _windows(draw):
    nd = draw(st.integers(1, 3))
    size = tuple(draw(st.integers(1, 9)) for _ in range(nd))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    stride = draw(st.one_of(st.integers(1, 3), st.tuples(*[st.integers(1, 3)] * nd)))
    dilation = draw(st.one_of(st.integers(1, 2), st.tuples(*[st.integers(1, 2)] * nd)))
    return size, kernel, stride, dilation


@given(_windows())
def test_autopad_through_f_pad_and_a_conv_or_pool_gives_ceil_in_over_stride(window):
    size, kernel, stride, dilation = window
    pad = autoPad(size, kernel, stride, dilation)
    x = torch.ones((1, 1, *size))
    conv, pool = _FUNCS[len(size)]
    y = conv(F.pad(x, pad), torch.ones((1, 1, *kernel)), stride=stride, dilation=dilation)
    strides = (stride,) * len(size) if isinstance(stride, int) else stride
    want = tuple(-(-n // s) for n, s in zip(size, strides, strict=True))
    assert tuple(y.shape[2:]) == want
    z = pool(F.pad(x, pad, value=-1.0), kernel, stride=stride, dilation=dilation)
    assert tuple(z.shape[2:]) == want


@given(_windows())
def test_autopad_is_autopad_flattened_last_axis_first_and_pads_like_np_pad(window):
    size, kernel, stride, dilation = window
    pairs = autopad(size, kernel, stride, dilation)
    flat = autoPad(size, kernel, stride, dilation)
    assert flat == tuple(v for pair in reversed(pairs) for v in pair)
    assert all(isinstance(v, int) for v in flat)
    x = np.arange(np.prod(size), dtype="float32").reshape((1, 1, *size))
    by_torch = F.pad(torch.from_numpy(x), flat).numpy()
    np.testing.assert_array_equal(by_torch, np.pad(x, ((0, 0), (0, 0), *pairs)))


def test_autopad_brochure_order_and_jnp_pad():
    # (D, H, W) = (4, 6, 8), kernel (1, 3, 5): (left, right, top, bottom, front, back)
    assert autoPad((4, 6, 8), (1, 3, 5)) == (2, 2, 1, 1, 0, 0)
    assert autoPad(7, 4) == (1, 2)  # odd totals: the extra element on the high side
    with pytest.warns(DeprecationWarning, match="compat.nebulae.toolkit.autoPad"):
        assert dualtrain.craft.autoPad is autoPad
    with pytest.warns(DeprecationWarning, match="dualtrain.autopad"):
        assert dualtrain.autoPad is autoPad
    x = jnp.ones((1, 1, 6, 8))
    padded = jnp.pad(x, ((0, 0), (0, 0), *autopad((6, 8), (3, 5))))
    assert padded.shape == F.pad(torch.ones(1, 1, 6, 8), autoPad((6, 8), (3, 5))).shape


@pytest.mark.parametrize("bad", [2.5, "3", None, {"h": 3}])
def test_autopad_refuses_a_size_that_is_no_int_nor_sequence_by_name(bad):
    # It called len() on it and raised a bare TypeError.
    for fn in (autopad, autoPad):
        with pytest.raises(ArgumentError, match="in_size must be"):
            fn(bad, 3)


# ---- TimeMachine as in the brochure ----


def test_timemachine_has_the_brochure_signatures():
    init = inspect.signature(TimeMachine).parameters
    assert list(init)[:3] == ["ckpt_path", "save_path", "max_anchors"]
    assert init["max_anchors"].default == -1
    to = inspect.signature(TimeMachine.to).parameters
    assert list(to)[1:5] == ["craft", "file", "ckpt_scope", "frozen"]
    assert to["file"].default == "" and to["ckpt_scope"].default is None
    drop = inspect.signature(TimeMachine.drop).parameters
    assert list(drop)[1:4] == ["craft", "file", "save_scope"]
    assert drop["file"].default == "" and drop["save_scope"].default is None


def test_timemachine_drops_and_loads_as_the_brochure_says(tmp_path):
    tm = TimeMachine(str(tmp_path / "ckpt"), str(tmp_path / "ckpt"), 2)  # positional
    net = dualtrain_torch.realize(NetNeb(10), seed=0)
    paths = [tm.drop(net) for _ in range(3)]
    assert [p.name for p in paths] == [
        "NEB-1.safetensors",
        "NEB-2.safetensors",
        "NEB-3.safetensors",
    ]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == paths_names(paths[1:])
    tm.drop(net, "head", save_scope="fc.bias")
    other = dualtrain_torch.realize(NetNeb(10), seed=1)
    assert tm.to(other) == []  # the scope's newest anchor
    assert torch.equal(other.fc.weight, net.fc.weight)
    jnet = dualtrain_jax.realize(NetNeb(10), seed=2)  # the same file under JAX
    assert tm.to(jnet, file="head", ckpt_scope="fc", frozen=False) == ["fc.weight"]
    np.testing.assert_array_equal(np.asarray(jnet.params["fc.bias"]), net.fc.bias.detach())
    with pytest.raises(CheckpointError, match="frozen"):
        tm.to(jnet, file="head", frozen=True)  # unmatched parts are not allowed


def paths_names(paths):
    return sorted(p.name for p in paths)
