"""A whole Craft under torch and JAX: same weights, same outputs, native behaviour."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import convert
from dualtrain.craft import Craft, dock, reference_forward

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy
from dualtrain_jax import craft as jcraft  # noqa: E402
from dualtrain_torch import craft as tcraft  # noqa: E402


class Net(Craft):
    """The issue's example network."""

    def __init__(self, nclass, scope="NET"):
        super().__init__(scope)
        self.conv = dock.Conv(3, 16, kernel=3, padding="same")
        self.bn = dock.BatchNorm(16)
        self.pool = dock.MaxPool(2)
        self.flat = dock.Reshape()
        self.fc = dock.Dense(16 * 16 * 16, nclass)

    def run(self, x):
        x = self.pool(dock.relu(self.bn(self.conv(x))))
        return self.fc(self.flat(x, (-1, 16 * 16 * 16)))


def canonical_torch(module):
    out = {}
    for name, value in module.state_dict().items():
        if name.endswith("num_batches_tracked"):
            continue
        out[name] = value.numpy()
    return out


@settings(max_examples=5)
@given(seed=st.integers(0, 2**31))
def test_same_seed_gives_identical_weights_in_both(seed):
    craft = Net(10)
    t = canonical_torch(tcraft.realize(craft, seed=seed))
    j = jcraft.realize(craft, seed=seed)
    jvalues = {**j.params, **j.state}
    assert sorted(t) == sorted(jvalues)
    for name, value in t.items():
        np.testing.assert_array_equal(value, np.asarray(jvalues[name]), err_msg=name)


@pytest.mark.parametrize("train", [False, True])
def test_whole_net_agrees_with_the_reference_in_float32(train):
    craft = Net(10)
    x = np.random.default_rng(0).normal(size=(4, 3, 32, 32)).astype(np.float32)
    ref, _ = reference_forward(craft, craft.init(5, "float64"), x.astype(np.float64), train=train)
    module = tcraft.realize(craft, seed=5)
    module.train(train)
    yt = module(torch.from_numpy(x)).detach().numpy()
    jm = jcraft.realize(craft, seed=5)
    yj, _ = jax.jit(lambda p, s, x: jm.apply(p, s, x, train=train))(jm.params, jm.state, x)
    scale = np.abs(ref).max()
    assert np.abs(yt - ref).max() <= 1e-5 * scale
    assert np.abs(np.asarray(yj) - ref).max() <= 1e-5 * scale


def test_the_torch_module_is_an_ordinary_module():
    module = tcraft.realize(Net(10), seed=0)
    assert isinstance(module, torch.nn.Module)
    assert module.fc.weight.shape == (10, 4096)  # nn.Linear's layout, the canonical one
    seen = []
    module.conv.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    module(torch.zeros(2, 3, 32, 32))
    assert seen == [torch.Size([2, 16, 32, 32])]
    assert module.to(torch.float64).fc.weight.dtype == torch.float64
    compiled = torch.compile(module, backend="aot_eager")
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    module.eval()
    torch.testing.assert_close(compiled(x), module(x))


def test_ddp_wraps_a_realized_module(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        x = torch.randn(2, 3, 32, 32)
        ddp = torch.nn.parallel.DistributedDataParallel(tcraft.realize(Net(10), seed=0))
        ddp(x).sum().backward()
        plain = tcraft.realize(Net(10), seed=0)
        plain(x).sum().backward()
        # One rank: the all-reduced gradient is the plain one.
        torch.testing.assert_close(ddp.module.fc.weight.grad, plain.fc.weight.grad)
        torch.testing.assert_close(ddp.module.conv.weight.grad, plain.conv.weight.grad)
    finally:
        dist.destroy_process_group()


def test_the_jax_module_works_under_jit_grad_and_vmap():
    craft = Net(10)
    jm = jcraft.realize(craft, seed=0)
    x = jnp.ones((2, 3, 32, 32))
    out, _ = jax.jit(jm.apply)(jm.params, jm.state, x)
    assert out.shape == (2, 10)
    grads = jax.grad(lambda p: jm.apply(p, jm.state, x, train=True)[0].sum())(jm.params)
    assert set(grads) == set(jm.params)
    per_example = jax.vmap(lambda xi: jm.apply(jm.params, jm.state, xi[None])[0][0])(x)
    np.testing.assert_allclose(per_example, out, rtol=1e-5)
    leaves = jax.tree_util.tree_leaves(jm)
    assert len(leaves) == len(jm.params) + len(jm.state)


def test_contexts_set_modes_and_restore_them():
    craft = Net(10)
    module = tcraft.realize(craft, seed=0)
    module.eval()
    with tcraft.Rudder(module) as training:
        assert training and module.training and torch.is_grad_enabled()
    assert not module.training
    with tcraft.Nozzle(module):
        assert not torch.is_grad_enabled() and not module.training
        assert not module(torch.zeros(1, 3, 32, 32)).requires_grad
    with tcraft.Prober(module):
        assert torch.is_grad_enabled() and not module.training
    jm = jcraft.realize(craft, seed=0)
    before = np.asarray(jm.state["bn.running_mean"]).copy()
    with jcraft.Rudder(jm):
        jm(jnp.ones((2, 3, 32, 32)))  # training mode: batch statistics update the state
    assert not np.array_equal(np.asarray(jm.state["bn.running_mean"]), before)
    with jcraft.Nozzle(jm):
        jm(jnp.ones((2, 3, 32, 32)))
    assert not jm.train


class WithTorchNative(Craft):
    def __init__(self):
        super().__init__()
        self.fc = dock.Dense(4, 4)
        self.native = torch.nn.Linear(4, 2)

    def run(self, x):
        return self.native(self.fc(x))


class WithJaxNative(Craft):
    def __init__(self):
        super().__init__()
        self.fc = dock.Dense(4, 4)
        self.act = dock.Native(jax.nn.softplus, backend="jax")

    def run(self, x):
        return self.act(self.fc(x))


def test_native_layers_run_under_their_framework_and_are_refused_by_the_other():
    module = tcraft.realize(WithTorchNative())
    assert "native.weight" in module.state_dict()
    assert module(torch.ones(3, 4)).shape == (3, 2)
    with pytest.raises(TypeError, match=r"torch-native layers \['native'\]"):
        jcraft.realize(WithTorchNative())
    jm = jcraft.realize(WithJaxNative())
    assert jm(jnp.ones((3, 4))).shape == (3, 4)
    with pytest.raises(TypeError, match=r"JAX-native layers \['act'\]"):
        tcraft.realize(WithJaxNative())


def test_coat_and_shell_round_trip_in_both():
    t = tcraft.coat([1.0, 2.0], as_const=False)
    assert t.requires_grad and t.dtype == torch.float32
    # Arrays and tensors keep their dtype; Python numbers take each framework's default.
    assert tcraft.coat(torch.ones(2, dtype=torch.float64)).dtype == torch.float64
    assert tcraft.coat(np.ones(2)).dtype == torch.float64
    assert tcraft.coat(3).dtype == torch.int64
    assert jcraft.coat(1.5).dtype == jnp.float32
    assert jcraft.coat(np.ones(2, np.float32)).dtype == jnp.float32
    assert tcraft.shell(t * 2).tolist() == [2.0, 4.0]
    assert tcraft.shell(torch.tensor(3.0)) == 3.0
    j = jcraft.coat(np.arange(3))
    assert isinstance(j, jax.Array)
    assert jcraft.shell(j).tolist() == [0, 1, 2]
    assert convert(jcraft.shell(j, as_np=False), to="numpy").tolist() == [0, 1, 2]


def test_bad_inputs_are_named_the_same_under_both():
    import dualtrain

    craft = Net(10)
    module, jm = tcraft.realize(craft), jcraft.realize(craft)
    for run in (lambda x: module(torch.from_numpy(x)), lambda x: jm(jnp.asarray(x))):
        with pytest.raises(dualtrain.ShapeError, match="Conv takes 3 channels on axis 1"):
            run(np.zeros((1, 4, 32, 32), np.float32))
        with pytest.raises(dualtrain.ShapeError, match="rank 4"):
            run(np.zeros((3, 32, 32), np.float32))
    with pytest.raises(ValueError, match=r"craft must be a dualtrain\.Craft instance"):
        tcraft.realize(torch.nn.Linear(2, 2))
