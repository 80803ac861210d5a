"""Every dock layer: torch == JAX == the NumPy reference, forward and gradients."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dualtrain
from dualtrain import convert
from dualtrain.craft import Craft, dock, reference_forward
from tests.strategies import LAYER_KINDS, dock_cases

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy
from dualtrain_jax import craft as jcraft  # noqa: E402
from dualtrain_torch import craft as tcraft  # noqa: E402

# Each example compiles fresh JAX kernels for its shapes: a third of the profile's examples
# per layer kind and mode keeps the suite's budget (DUALTRAIN_HYPOTHESIS=thorough scales it).
FEW = settings(max_examples=max(5, settings().max_examples // 3))


class One(Craft):
    def __init__(self, layer):
        super().__init__("one")
        self.layer = layer

    def run(self, x):
        return self.layer(x)


def perturbed(craft, seed, dtype):
    """Initial values moved off their defaults, so ones/zeros do not hide mistakes."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in craft.init(seed, "float64").items():
        v = value + 0.3 * rng.normal(size=value.shape)
        out[name] = (np.abs(v) + 0.5 if name.endswith("running_var") else v).astype(dtype)
    return out


def split(craft, values):
    specs = craft.param_specs()
    params = {k: v for k, v in values.items() if specs[k].trainable}
    return params, {k: v for k, v in values.items() if not specs[k].trainable}


def torch_run(craft, values, x, train, cotangent):
    module = tcraft.realize(craft, dtype=str(next(iter(values.values()), x).dtype))
    tcraft.load_canonical(module, values)
    module.train(train)
    xt = torch.tensor(x, requires_grad=x.dtype.kind == "f")
    y = module(xt)
    state = {k: v.detach().numpy().copy() for k, v in module.state_dict().items() if "running" in k}
    grads = {}
    if cotangent is not None:
        (y * torch.from_numpy(cotangent)).sum().backward()
        for name, p in module.named_parameters():
            grads[name] = p.grad.numpy()
        if xt.grad is not None:
            grads["input"] = xt.grad.numpy()
    return y.detach().numpy(), state, grads


def jax_run(craft, values, x, train, cotangent):
    module = jcraft.realize(craft, dtype=str(next(iter(values.values()), x).dtype))
    params, state = split(craft, convert(values, to="jax"))
    xj = convert(x, to="jax")
    y, new_state = module.apply(params, state, xj, train=train, rng=jax.random.key(0))
    grads = {}
    if cotangent is not None:
        ct = convert(cotangent, to="jax")

        def loss(p, inp):
            return (module.apply(p, state, inp, train=train, rng=jax.random.key(0))[0] * ct).sum()

        if x.dtype.kind == "f":
            gp, gx = jax.grad(loss, argnums=(0, 1))(params, xj)
            grads["input"] = np.asarray(gx)
        else:
            gp = jax.grad(loss)(params, xj)
        grads.update({k: np.asarray(v) for k, v in gp.items()})
    return np.asarray(y), {k: np.asarray(v) for k, v in new_state.items()}, grads


def close(a, b, tol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape
    scale = max(1.0, float(np.abs(b).max(initial=0.0)))
    assert float(np.abs(a - b).max(initial=0.0)) <= tol * scale


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@FEW
@given(data=st.data())
def test_float64_torch_equals_jax_equals_reference(kind, train, data):
    layer, x = data.draw(dock_cases(kind))
    if kind == "Dropout" and train:
        return  # masks come from each framework's generator: see the dropout law below
    craft = One(layer)
    values = perturbed(craft, 1, np.float64)
    params, state = split(craft, values)
    ref, ref_state = reference_forward(craft, params, x, state=state, train=train)
    cotangent = np.random.default_rng(2).normal(size=np.shape(ref))
    with jax.enable_x64(True):
        yt, st_t, gt = torch_run(craft, values, x, train, cotangent)
        yj, st_j, gj = jax_run(craft, values, x, train, cotangent)
    close(yt, ref, 1e-10)
    close(yj, ref, 1e-10)
    for name, value in ref_state.items():
        close(st_t[name], value, 1e-10)
        close(st_j[name], value, 1e-10)
    assert sorted(gt) == sorted(gj)
    for name in gt:
        close(gj[name], gt[name], 1e-9)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@FEW
@given(data=st.data())
def test_float32_torch_and_jax_within_1e5_of_reference(kind, data):
    layer, x = data.draw(dock_cases(kind))
    craft = One(layer)
    values = perturbed(craft, 3, np.float32)
    floating = x.dtype.kind == "f"
    x32 = x.astype(np.float32) if floating else x
    params, state = split(craft, values)
    widen = lambda d: {k: v.astype(np.float64) for k, v in d.items()}  # noqa: E731
    x_ref = x32.astype(np.float64) if floating else x
    ref, _ = reference_forward(craft, widen(params), x_ref, state=widen(state))
    yt, _, _ = torch_run(craft, values, x32, False, None)
    yj, _, _ = jax_run(craft, values, x32, False, None)
    assert yt.dtype == yj.dtype == np.float32
    close(yt, ref, 1e-5)
    close(yj, ref, 1e-5)


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
@given(p=st.floats(0.05, 0.9), seed=st.integers(0, 100))
def test_dropout_zeroes_or_scales_each_element(backend, p, seed):
    craft = One(dock.Dropout(p))
    x = np.random.default_rng(seed).uniform(1, 2, size=(64, 8))
    if backend == "numpy":
        y, _ = reference_forward(craft, {}, x, train=True, seed=seed)
    elif backend == "torch":
        y, _, _ = torch_run(craft, {}, x, True, None)
    else:
        with jax.enable_x64(True):
            y, _, _ = jax_run(craft, {}, x, True, None)
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p), rtol=1e-12)
    # Each element kept with probability 1 - p: the kept fraction is within 5 sigma of it.
    sigma = np.sqrt(p * (1 - p) / kept.size)
    assert abs(kept.mean() - (1 - p)) <= 5 * sigma


@pytest.mark.parametrize("kind", LAYER_KINDS)
@settings(max_examples=3)
@given(data=st.data())
def test_jax_gradients_under_jit_equal_eager_ones(kind, data):
    layer, x = data.draw(dock_cases(kind))
    craft = One(layer)
    values = perturbed(craft, 4, np.float32)
    module = jcraft.realize(craft)
    params, state = split(craft, convert(values, to="jax"))
    xj = convert(x.astype(np.float32) if x.dtype.kind == "f" else x, to="jax")
    key = jax.random.key(1)
    shape = module.apply(params, state, xj, train=True, rng=key)[0].shape
    cotangent = jnp.asarray(np.random.default_rng(5).normal(size=shape).astype(np.float32))

    def loss(p, inp):
        return (module.apply(p, state, inp, train=True, rng=key)[0] * cotangent).sum()

    argnums = (0, 1) if x.dtype.kind == "f" else (0,)
    eager = jax.grad(loss, argnums)(params, xj)
    jitted = jax.jit(jax.grad(loss, argnums))(params, xj)  # MaxPool once failed only here
    for e, j in zip(
        jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted), strict=True
    ):
        close(np.asarray(j), np.asarray(e), 1e-5)


OPS = {
    "relu": lambda ops, x: ops.relu(x),
    "gelu": lambda ops, x: ops.gelu(x),
    "sigmoid": lambda ops, x: ops.sigmoid(x),
    "tanh": lambda ops, x: ops.tanh(x),
    "softmax": lambda ops, x: ops.softmax(x, axis=-1),
    "log_softmax": lambda ops, x: ops.log_softmax(x, axis=0),
    "concat": lambda ops, x: ops.concat([x, x * 2], axis=-1),
    "add": lambda ops, x: ops.add(x, x[..., :1]),
    "mean": lambda ops, x: ops.mean(x, axis=-1, keepdims=True),
    "matmul": lambda ops, x: ops.matmul(x, x.T if x.ndim == 2 else x),
    "pad": lambda ops, x: ops.pad(x, ((1, 0), (0, 2)), value=-1.5),
}


@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=10)
@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 5)),
    seed=st.integers(0, 2**31),
)
def test_functional_ops_torch_equal_jax_equal_reference(op, shape, seed):
    x = np.random.default_rng(seed).normal(size=shape) * 3
    expected = OPS[op](dock, x)  # NumPy arrays dispatch to the reference
    with jax.enable_x64(True):
        got_jax = np.asarray(OPS[op](dock, jnp.asarray(x)))
    got_torch = OPS[op](dock, torch.from_numpy(x)).numpy()
    close(got_torch, expected, 1e-12)
    close(got_jax, expected, 1e-12)


@settings(max_examples=15)
@given(
    rows=st.integers(1, 6),
    classes=st.integers(1, 5),
    seed=st.integers(0, 2**31),
)
def test_cross_entropy_and_accuracy_torch_equal_jax_equal_reference(rows, classes, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, classes)) * 3
    labels = rng.integers(0, classes, rows)
    # the reference by its definition, row by row
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    want_xe = -np.mean([logp[i, labels[i]] for i in range(rows)])
    want_acc = np.mean([int(np.argmax(logits[i]) == labels[i]) for i in range(rows)])
    for op, want in ((dock.cross_entropy, want_xe), (dock.accuracy, want_acc)):
        close(np.asarray(op(logits, labels)), np.asarray(want), 1e-12)
        with jax.enable_x64(True):
            close(np.asarray(op(jnp.asarray(logits), jnp.asarray(labels))), np.asarray(want), 1e-12)
        got = op(torch.from_numpy(logits), torch.from_numpy(labels)).numpy()
        close(got, np.asarray(want), 1e-12)
    # cross_entropy is torch's own loss, and its gradient flows under both frameworks
    t = torch.from_numpy(logits).requires_grad_()
    dock.cross_entropy(t, torch.from_numpy(labels)).backward()
    jgrad = jax.grad(lambda z: dock.cross_entropy(z, jnp.asarray(labels)))(
        jnp.asarray(logits, "float32")
    )
    close(np.asarray(jgrad), t.grad.numpy(), 1e-5)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: dock.pad(x, (1, 1)), "pads must be (low, high) pairs of ints >= 0"),
        (lambda x: dock.pad(x, ((0, -1),)), "pads must be (low, high) pairs of ints >= 0"),
        (lambda x: dock.pad(x, ((0, 1),) * 3), "at most one per axis of (2, 3)"),
        (lambda x: dock.cross_entropy(x, np.zeros(3, "int64")), "labels (N,); got (2, 3) and (3,)"),
        (lambda x: dock.accuracy(x[0], np.zeros(2, "int64")), "logits (N, K) and labels (N,)"),
    ],
)
def test_bad_op_inputs_are_named(call, message):
    with pytest.raises(dualtrain.DualtrainError) as info:
        call(np.zeros((2, 3), "float32"))
    assert message in str(info.value)


def test_labels_outside_the_classes_raise_or_give_nan_never_a_wrong_number():
    logits = np.zeros((2, 3), "float32")
    for labels in ([0, 3], [0, -1], [0, -100]):  # -100: torch's default ignore_index
        with pytest.raises(dualtrain.errors.OutOfRangeError, match=r"labels must be classes"):
            dock.cross_entropy(logits, np.array(labels))
        with pytest.raises(IndexError):
            dock.cross_entropy(torch.from_numpy(logits), torch.tensor(labels))
        assert np.isnan(np.asarray(dock.cross_entropy(jnp.asarray(logits), jnp.asarray(labels))))
    # integer scores: the fraction in float32 under every backend (not truncated to 0)
    scores, labels = np.array([[1, 2], [3, 1]]), np.array([1, 1])
    for conv in (np.asarray, torch.tensor, jnp.asarray):
        assert float(dock.accuracy(conv(scores), conv(labels))) == 0.5
