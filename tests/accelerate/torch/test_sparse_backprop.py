"""Top-k backprop under torch: exact when k reaches the features, the reference otherwise,
and a patched module that is still the same ordinary module."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain.accelerate.topk import Approximation
from dualtrain.errors import ArgumentError
from tests.accelerate.test_topk import dense_cases, reference_grads

torch = pytest.importorskip("torch")
nn = torch.nn
from dualtrain_torch.sparse_backprop import (  # noqa: E402
    TopKLinear,
    patch_linears,
    topk_linear,
    unpatch_linears,
)


def linear_for(case, dtype=torch.float64) -> nn.Linear:
    n_out, n_in = case.weight.shape
    layer = nn.Linear(n_in, n_out, bias=case.bias is not None, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(case.weight))
        if case.bias is not None:
            layer.bias.copy_(torch.from_numpy(case.bias))
    return layer


def grads_of(layer: nn.Module, case, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """Gradients of ``sum(layer(x) * G)``: the upstream gradient is exactly ``G``."""
    x = torch.from_numpy(case.x).to(dtype).requires_grad_()
    (layer(x) * torch.from_numpy(case.grad).to(dtype)).sum().backward()
    out = {"x": x.grad, "weight": layer.weight.grad}
    if layer.bias is not None:
        out["bias"] = layer.bias.grad
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@given(case=dense_cases(dense=True))
def test_k_at_or_past_the_features_gives_exactly_the_dense_gradients(dtype, case):
    dense = linear_for(case, dtype)
    patched = copy.deepcopy(dense)
    [approx] = patch_linears(patched, k=case.k)
    assert approx.dense
    want, got = grads_of(dense, case, dtype), grads_of(patched, case, dtype)
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


@given(case=dense_cases(dense=False))
def test_k_below_the_features_gives_the_reference_gradients(case):
    layer = linear_for(case)
    x = torch.from_numpy(case.x)
    dense_out = layer(x)
    [approx] = patch_linears(layer, k=case.k)
    assert not approx.dense
    got = grads_of(layer, case)
    torch.testing.assert_close(layer(x), dense_out, rtol=0, atol=0)  # the forward is exact
    want = reference_grads(case)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name].numpy(), value, rtol=1e-10, atol=1e-12, err_msg=name)


@given(case=dense_cases())
def test_the_function_form_agrees_with_the_reference(case):
    x = torch.from_numpy(case.x).requires_grad_()
    w = torch.from_numpy(case.weight).requires_grad_()
    b = None if case.bias is None else torch.from_numpy(case.bias).requires_grad_()
    (topk_linear(x, w, b, case.k) * torch.from_numpy(case.grad)).sum().backward()
    want = reference_grads(case)
    np.testing.assert_allclose(x.grad.numpy(), want["x"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), want["weight"], rtol=1e-10, atol=1e-12)
    if b is not None:
        np.testing.assert_allclose(b.grad.numpy(), want["bias"], rtol=1e-10, atol=1e-12)


# nebulgym's bug: round(0.04 * out) == 0 for heads of up to 12 outputs, and then no gradient
# reached anything upstream of the head.


def nebulgym_readme_model() -> nn.Module:
    """nebulgym's README model (BatchNorm1d + Linear stack ending in Linear(256, 2)), small."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(48, 64),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Linear(64, 256),
        nn.BatchNorm1d(256),
        nn.ReLU(),
        nn.Linear(256, 2),
    )


def test_the_readme_model_trains_every_parameter_with_the_default_ratio():
    model = nebulgym_readme_model()
    found = patch_linears(model)
    assert [(a.layer, a.features, a.k) for a in found] == [
        ("1", 64, 3),
        ("4", 256, 10),
        ("7", 2, 1),  # nebulgym's k was 0 here
    ]
    model.train()
    nn.functional.cross_entropy(model(torch.randn(8, 3, 4, 4)), torch.tensor([0, 1] * 4)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@settings(max_examples=12)
@given(head=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_a_small_head_still_sends_gradient_upstream(head, seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, head))
    found = patch_linears(model)
    assert [a.k for a in found] == [1, 1]
    x = torch.randn(3, 6, requires_grad=True)
    model(x).pow(2).sum().backward()
    assert x.grad.abs().sum() > 0
    assert model[0].weight.grad.abs().sum() > 0


def test_3d_inputs_run_and_match_the_reference():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 5, 7))
    layer = nn.Linear(7, 9, dtype=torch.float64)
    patch_linears(layer, k=2)
    g = rng.normal(size=(2, 5, 9))
    xt = torch.from_numpy(x).requires_grad_()
    (layer(xt) * torch.from_numpy(g)).sum().backward()
    assert xt.grad.shape == (2, 5, 7)
    assert (xt.grad.reshape(-1, 7).abs().sum(-1) > 0).all()  # every token got a gradient
    kept = np.zeros_like(g)
    rows = g.reshape(-1, 9)
    top = np.argsort(-np.abs(rows), axis=-1)[:, :2]
    np.put_along_axis(kept.reshape(-1, 9), top, np.take_along_axis(rows, top, -1), -1)
    np.testing.assert_allclose(xt.grad.numpy(), kept @ layer.weight.detach().numpy())


# the patched module is the same module


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3, bias=False)
        self.norm = nn.LayerNorm(3)
        self.attn = nn.MultiheadAttention(3, 1, batch_first=True)

    def forward(self, x):
        h = self.norm(self.fc2(torch.relu(self.fc1(x))))
        return self.attn(h, h, h, need_weights=False)[0]


def test_patching_keeps_the_module_what_it_was():
    model = Block()
    keys = list(model.state_dict())
    params = list(model.parameters())
    x = torch.randn(2, 5, 4)
    before = model(x)
    found = patch_linears(model, ratio=0.5)
    # MultiheadAttention's out_proj is an nn.Linear subclass it never calls: left alone.
    assert [(a.layer, a.features, a.k) for a in found] == [("fc1", 8, 4), ("fc2", 3, 2)]
    assert type(model.fc1) is TopKLinear and isinstance(model.fc1, nn.Linear)
    assert type(model.attn.out_proj) is not TopKLinear
    assert list(model.state_dict()) == keys
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)
    assert "topk_k=4 (approximate backprop)" in repr(model.fc1)


def test_hooks_fire_on_a_patched_layer():
    model = Block()
    patch_linears(model, k=1)
    seen = []
    model.fc1.register_forward_hook(lambda m, i, o: seen.append("forward"))
    model.fc1.register_full_backward_hook(lambda m, gi, go: seen.append("backward"))
    model.fc1.weight.register_hook(lambda g: seen.append("weight"))
    model(torch.randn(2, 5, 4, requires_grad=True)).sum().backward()
    assert sorted(seen) == ["backward", "forward", "weight"]


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copy_keeps_the_patch_and_the_values(how):
    model = Block()
    patch_linears(model, k=2)
    twin = pickle.loads(pickle.dumps(model)) if how == "pickle" else copy.deepcopy(model)
    assert type(twin.fc1) is TopKLinear and twin.fc1.topk_k == 2
    for (name, a), (_, b) in zip(
        model.state_dict().items(), twin.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    x = torch.randn(2, 5, 4)
    model(x).sum().backward()
    twin(x).sum().backward()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_unpatch_restores_plain_linears():
    model = Block()
    patch_linears(model, k=1)
    assert unpatch_linears(model) == 2
    assert type(model.fc1) is nn.Linear and type(model.fc2) is nn.Linear
    assert not hasattr(model.fc1, "topk_k")
    assert unpatch_linears(model) == 0


def test_patching_twice_updates_k_and_a_root_linear_is_patched():
    layer = nn.Linear(3, 10)
    assert patch_linears(layer, k=2) == [Approximation("", 10, 2)]
    assert patch_linears(layer, k=20) == [Approximation("", 10, 20)]
    assert layer.topk_k == 20 and type(layer) is TopKLinear
    assert "(exact)" in repr(layer)


def test_frozen_weights_no_bias_and_constant_inputs_work():
    layer = nn.Linear(5, 6, bias=False, dtype=torch.float64)
    layer.weight.requires_grad_(False)
    patch_linears(layer, k=2)
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is None
    trained = nn.Linear(5, 6)
    patch_linears(trained, k=2)
    trained(torch.randn(4, 5)).sum().backward()  # the input wants no gradient
    assert trained.weight.grad is not None and trained.bias.grad is not None
    with torch.no_grad():
        assert trained(torch.randn(1, 5)).shape == (1, 6)


def test_bad_arguments_patch_nothing():
    model = Block()
    with pytest.raises(ArgumentError, match="k must be an int >= 1; got k=0"):
        patch_linears(model, k=0)
    with pytest.raises(ArgumentError, match=r"ratio must be a number in \(0, 1\]; got ratio=2"):
        patch_linears(model, ratio=2)
    assert type(model.fc1) is nn.Linear
    with pytest.raises(ArgumentError, match=r"module must be a torch\.nn\.Module"):
        patch_linears("model")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="k must be an int >= 1; got k=-1"):
        topk_linear(torch.ones(1, 2), torch.ones(3, 2), None, -1)
