"""torchmb's own test suite, re-expressed against `dualtrain_torch.compat.torchmb`.

torchmb's tests/test_batch.py, test_functional.py and test_layers.py check: registering a
batch module, several inputs and outputs, `test_model_batching`; `batch_accuracy`,
`batch_loss` and `to_batch_func` against a loop over the members; and for Linear, Conv2d,
BatchNorm2d, GroupNorm, a LeNet and a ResNet: state dicts, forward, backward, that one
member's loss reaches only that member, one SGD step, running statistics. The same claims
here, on small generated data, importing only torchmb's module paths under the compat
namespace, with torchmb's tolerances (Linear and LeNet 1e-5, Conv2d and ResNet 1e-4) and,
for the norms, bit-for-bit equality with torch's own layers, where torchmb asked for 1e-7.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from hypothesis import given, settings, strategies as st
from torch import fx, nn

from dualtrain_torch.compat import torchmb
from dualtrain_torch.compat.torchmb.base import AbstractBatchModule
from dualtrain_torch.compat.torchmb.batch import BatchModule, merge_batch, split_batch
from dualtrain_torch.compat.torchmb.functional import batch_accuracy, batch_loss
from dualtrain_torch.compat.torchmb.layers import (
    BatchBatchNorm2d,
    BatchConv2d,
    BatchGroupNorm,
    BatchLinear,
)
from dualtrain_torch.compat.torchmb.tests import test_batched_model, test_model_batching
from dualtrain_torch.compat.torchmb.utils import register_batch_module, to_batch_func


@pytest.fixture(autouse=True)
def _registry():
    """Each test registers into a registry restored afterwards."""
    saved = dict(torchmb.BATCH_MODULES)
    yield
    torchmb.BATCH_MODULES.clear()
    torchmb.BATCH_MODULES.update(saved)


def close(a, b, tol):
    """torchmb's check: ``torch.allclose`` with rtol = atol = tol (0: bit for bit)."""
    if tol == 0:
        assert torch.equal(a, b), f"not bit-identical: max |a - b| = {(a - b).abs().max()}"
    else:
        assert torch.allclose(a, b, tol, tol), f"max |a - b| = {(a - b).abs().max()} > {tol}"


# -- test_batch.py: registering, several inputs and outputs, test_model_batching ----------


def test_a_registered_parameter_free_module_runs_as_its_batch_module():
    class Zeros(nn.Module):
        def forward(self, x):
            return torch.zeros_like(x)

    class BatchZeros(AbstractBatchModule):
        base_class = Zeros

        @classmethod
        def from_module(cls, module, batch):
            return cls(batch)

        def forward(self, x):
            return torch.zeros_like(x)

    register_batch_module(BatchZeros)
    x = torch.ones(4, 2, 3, 5, 5)
    direct = BatchZeros.from_module(Zeros(), 4)(x)
    close(direct, BatchModule(Zeros(), 4)(x), 0)


def test_a_batch_module_takes_and_gives_several_tensors():
    class SumDiff(nn.Module):
        def forward(self, x, y):
            return x + y, x - y

    class BatchSumDiff(AbstractBatchModule):
        base_class = SumDiff

        def forward(self, x, y):
            return x + y, x - y

    register_batch_module(BatchSumDiff)
    x, y = torch.randn(4, 3, 2), torch.randn(4, 3, 2)
    u, v = BatchSumDiff.from_module(SumDiff(), 4)(x, y)
    close(u, x + y, 0)
    close(v, x - y, 0)
    u, v = BatchModule(SumDiff(), 4)(x, y)
    close(u, x + y, 0)
    close(v, x - y, 0)


def test_model_batching_passes_for_a_conv_model_as_torchmbs_test_asks():
    torch.manual_seed(0)
    # torchmb: a 3 -> 32 channel 3x3 conv on 5 x 3 x 16 x 16 inputs, 5 members, atol 1e-5.
    test_model_batching(nn.Sequential(nn.Conv2d(3, 8, 3)), [(2, 3, 7, 7)], 3, atol=1e-5)


class FirstMemberLinear(BatchLinear):
    """A wrong batch module: every member computes with member 0's weights."""

    def forward(self, x):
        b = x.shape[0] // self.batch
        return (x @ self.weight[0].T + self.bias[0]).reshape(b * self.batch, -1)


def test_batched_model_fails_a_wrong_member_and_restores_both_states():
    torch.manual_seed(0)
    model, bad = nn.Linear(3, 2), FirstMemberLinear(3, 2, True, 3)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    members = [{k: v.clone() for k, v in s.items()} for s in bad.state_dicts()]
    with pytest.raises(AssertionError, match=r"member 1's output 0 differs .* max \|a - b\|"):
        test_batched_model(bad, model, [(4, 3)])
    assert model.training and bad.training
    for k, v in model.state_dict().items():
        close(v, before[k], 0)
    for got, want in zip(bad.state_dicts(), members, strict=True):
        for k in want:
            close(got[k], want[k], 0)
    # The same check passes the right layer, on merged rows, and a BatchModule on [G, B].
    test_batched_model(BatchLinear(3, 2, True, 3), model, [(4, 3)], rtol=1e-5, atol=1e-5)
    test_batched_model(BatchModule(model, 3), model, [(4, 3)], rtol=1e-5, atol=1e-5)


# -- test_functional.py: batch_accuracy, batch_loss, to_batch_func ----------------------


def _top_k_by_hand(scores, labels, ks):
    order = scores.argsort(-1, descending=True)
    return [float((order[:, :k] == labels[:, None]).any(-1).float().mean()) for k in ks]


@settings(max_examples=15)
@given(g=st.integers(1, 4), b=st.integers(1, 6), classes=st.integers(2, 7), seed=st.integers(0, 99))
def test_batch_accuracy_is_each_members_top_k(g, b, classes, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(g, b, classes, generator=gen)
    labels = torch.randint(0, classes, (g, b), generator=gen)
    ks = (1, min(5, classes))
    got = batch_accuracy(scores, labels, g, ks)
    want = torch.tensor([_top_k_by_hand(scores[i], labels[i], ks) for i in range(g)]).T
    close(got, want.to(got.dtype), 1e-7)
    counts = batch_accuracy(scores, labels, g, ks, count=True)
    close(counts, (want * b).round().long(), 0)


def test_batch_loss_and_its_gradient_are_each_members_cross_entropy():
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(5, 8, 4, generator=gen)
    labels = torch.randint(0, 4, (5, 8), generator=gen)
    mine, theirs = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    losses = batch_loss(mine, labels, 5, F.cross_entropy, "mean")
    want = torch.stack([F.cross_entropy(theirs[i], labels[i]) for i in range(5)])
    close(losses, want, 1e-6)
    losses.sum().backward()
    want.sum().backward()
    close(mine.grad, theirs.grad, 1e-6)


PER_SAMPLE: list[Callable[[torch.Tensor], torch.Tensor]] = [
    lambda x: F.softmax(x, -1),
    lambda x: F.log_softmax(x, dim=-1),
    lambda x: torch.softmax(x, 0),  # across the member's samples: its own only
    lambda x: x - x.mean(0),  # torchmb's rewrite mixed the members here
]


@settings(max_examples=20)
@given(
    which=st.integers(0, len(PER_SAMPLE) - 1),
    g=st.integers(1, 4),
    b=st.integers(1, 5),
    c=st.integers(1, 6),
    order=st.sampled_from(["g b", "b g"]),
)
def test_to_batch_func_is_the_function_per_member_forward_and_backward(which, g, b, c, order):
    func = PER_SAMPLE[which]
    x = torch.randn(g, b, c, generator=torch.Generator().manual_seed(g * 100 + b * 10 + c))
    mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    laid = mine if order == "g b" else mine.transpose(0, 1)
    got = to_batch_func(func, g, order)(laid)
    got = got if order == "g b" else got.transpose(0, 1)
    want = torch.stack([func(theirs[i]) for i in range(g)])
    close(got, want, 1e-6)
    weights = torch.linspace(-1, 1, got.numel()).reshape(got.shape)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    close(mine.grad, theirs.grad, 1e-6)


def test_to_batch_func_takes_a_call_function_node_as_torchmb_passes_it():
    graph = fx.Graph()
    node = graph.call_function(torch.log_softmax, (graph.placeholder("x"), -1))
    batched = to_batch_func(node, 3)
    assert batched.__name__ == "batch_log_softmax"
    scores = torch.randn(3, 2, 4)
    close(batched(scores, -1), torch.stack([torch.log_softmax(s, -1) for s in scores]), 1e-7)


# -- test_layers.py: each batched layer against its torch layer, member by member -------


@dataclasses.dataclass(frozen=True)
class Layer:
    """A torch layer, its batched counterpart, a per-sample input shape, torchmb's tolerance."""

    name: str
    plain: Callable[[], nn.Module]
    batched: Callable[[int], AbstractBatchModule]
    sample: tuple[int, ...]
    tol: float


def _randomized(module: nn.Module) -> nn.Module:
    """torchmb's set-up: weights in [1, 2], biases and means normal, variances in [1, 2]."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith(("weight", "running_var")) and t.ndim == 1:
                t.uniform_(1, 2)
            else:
                t.normal_()
    return module


LAYERS = [
    Layer("linear", lambda: nn.Linear(5, 4), lambda g: BatchLinear(5, 4, True, g), (5,), 1e-5),
    Layer(
        "conv2d",
        lambda: nn.Conv2d(4, 6, 3),
        lambda g: BatchConv2d(4, 6, 3, batch=g),
        (4, 6, 6),
        1e-4,
    ),
    Layer(
        "batchnorm2d",
        lambda: nn.BatchNorm2d(4),
        lambda g: BatchBatchNorm2d(4, batch=g),
        (4, 3, 3),
        0,
    ),
    Layer(
        "groupnorm",
        lambda: nn.GroupNorm(2, 6),
        lambda g: BatchGroupNorm(2, 6, batch=g),
        (6, 3, 3),
        0,
    ),
]
G, B = 3, 4


def _setup(layer, g=G, b=B, seed=0):
    torch.manual_seed(seed)
    plain = [_randomized(layer.plain()) for _ in range(g)]
    batched = layer.batched(g)
    batched.load_state_dicts([m.state_dict() for m in plain])
    x = torch.randn(g, b, *layer.sample)
    return plain, batched, x


def _run(plain, batched, x):
    """Each member's output ``[G, B, ...]``: by the plain layers, and by the batched one."""
    xs, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    separate = torch.stack([m(xi) for m, xi in zip(plain, xs, strict=True)])
    together = split_batch(batched(merge_batch(xb)), len(plain))
    return xs, xb, separate, together


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_state_dicts_round_trip(layer):
    plain, batched, _ = _setup(layer)
    for got, m in zip(batched.state_dicts(), plain, strict=True):
        assert got.keys() == m.state_dict().keys()
        for k, v in m.state_dict().items():
            close(got[k], v, 0)


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_forward_in_eval_is_each_members_layer(layer):
    plain, batched, x = _setup(layer)
    for m in [*plain, batched]:
        m.eval()
    with torch.no_grad():
        _, _, separate, together = _run(plain, batched, x)
    close(together, separate, layer.tol)


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_backward_gives_each_members_gradients(layer):
    plain, batched, x = _setup(layer)
    xs, xb, separate, together = _run(plain, batched, x)
    close(together, separate, layer.tol)
    separate.sum().backward()
    together.sum().backward()
    for name, p in batched.named_parameters():
        close(p.grad, torch.stack([m.get_parameter(name).grad for m in plain]), layer.tol)
    close(xb.grad, xs.grad, layer.tol)


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
@pytest.mark.parametrize("member", [0, G - 1])
def test_one_members_loss_reaches_that_member_only(layer, member):
    plain, batched, x = _setup(layer)
    xs, xb, separate, together = _run(plain, batched, x)
    separate[member].sum().backward()
    together[member].sum().backward()
    others = [i for i in range(G) if i != member]
    close(xb.grad[member], xs.grad[member], layer.tol)
    assert not xb.grad[others].any()
    for name, p in batched.named_parameters():
        close(p.grad[member], plain[member].get_parameter(name).grad, layer.tol)
        assert not p.grad[others].any(), f"{name}'s gradient reached other members"


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_two_sgd_steps_with_nesterov_momentum_and_decay_match(layer):
    """torchmb's test_optimize (lr 1, momentum 0.5, Nesterov, weight decay 1), twice."""
    plain, batched, x = _setup(layer)
    for m in [*plain, batched]:
        m.train()

    def sgd(params):
        return torch.optim.SGD(params, lr=1, momentum=0.5, nesterov=True, weight_decay=1)

    mine, theirs = sgd(batched.parameters()), [sgd(m.parameters()) for m in plain]
    for _ in range(2):
        _, _, separate, together = _run(plain, batched, x)
        together.sum().backward()
        separate.sum().backward()
        for opt in [mine, *theirs]:
            opt.step()
            opt.zero_grad()
    for got, m in zip(batched.state_dicts(), plain, strict=True):
        for k, v in m.state_dict().items():
            # Linear, Conv2d: weights ~ 10 after two steps at lr 1; torchmb's tolerance in kind.
            close(got[k], v, layer.tol * 10)


def test_batch_norm_running_statistics_are_each_members():
    layer = LAYERS[2]
    plain, batched, x = _setup(layer)
    for _ in range(3):
        _run(plain, batched, x * 2 + 1)
    for got, m in zip(batched.state_dicts(), plain, strict=True):
        for k, v in m.state_dict().items():
            close(got[k], v, 0)
    assert batched.num_batches_tracked.tolist() == [3] * G
    batched.eval()
    _run(plain, batched, x)
    assert batched.num_batches_tracked.tolist() == [3] * G  # torchmb counted eval calls too


# Drawn sizes: member g of each batched layer is torch's layer with member g's tensors.
@settings(max_examples=25)
@given(
    kind=st.sampled_from(["batchnorm", "groupnorm", "linear", "conv"]),
    g=st.integers(1, 4),
    b=st.integers(2, 4),
    groups=st.integers(1, 3),
    per_group=st.integers(1, 3),
    side=st.integers(1, 4),
    training=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_member_g_is_torchs_layer_with_member_gs_tensors(
    kind, g, b, groups, per_group, side, training, seed
):
    c = groups * per_group
    if kind == "batchnorm":
        layer = Layer(
            kind,
            lambda: nn.BatchNorm2d(c),
            lambda n: BatchBatchNorm2d(c, batch=n),
            (c, side, side),
            0,
        )
    elif kind == "groupnorm":
        layer = Layer(
            kind,
            lambda: nn.GroupNorm(groups, c),
            lambda n: BatchGroupNorm(groups, c, batch=n),
            (c, side, side + 1),
            0,
        )
    elif kind == "linear":
        layer = Layer(
            kind,
            lambda: nn.Linear(c, side),
            lambda n: BatchLinear(c, side, True, n),
            (per_group, c),
            1e-5,
        )
    else:
        k = min(side, 2)
        layer = Layer(
            kind,
            lambda: nn.Conv2d(c, 2 * groups, k, groups=groups, padding=1, padding_mode="reflect"),
            lambda n: BatchConv2d(c, 2 * groups, k, 1, 1, 1, groups, True, "reflect", n),
            (c, side + 1, side + 1),
            1e-5,
        )
    plain, batched, x = _setup(layer, g, b, seed)
    for m in [*plain, batched]:
        m.train(training)
    xs, xb, separate, together = _run(plain, batched, x)
    close(together, separate, layer.tol)
    weights = torch.randn(separate.shape, generator=torch.Generator().manual_seed(seed))
    (separate * weights).sum().backward()
    (together * weights).sum().backward()
    close(xb.grad, xs.grad, layer.tol)
    for name, p in batched.named_parameters():
        close(p.grad, torch.stack([m.get_parameter(name).grad for m in plain]), layer.tol)
    for got, m in zip(batched.state_dicts(), plain, strict=True):
        for key, v in m.state_dict().items():
            close(got[key], v, layer.tol)


# -- test_layers.py's models: a LeNet and a small ResNet through BatchModule -------------


class LeNet(nn.Module):
    """torchmb's test LeNet, narrowed: one 12x12 channel in, 10 classes out."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(3, 4, 3), nn.ReLU()
        )
        self.classifier = nn.Sequential(nn.Linear(36, 12), nn.ReLU(), nn.Linear(12, 10))

    def forward(self, x):
        x = self.layers(x)
        return self.classifier(x.view(x.shape[0], -1))


class Block(nn.Module):
    """torchmb's ResNet basic block: conv-bn-relu-conv-bn, a projected shortcut, relu."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
        )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return F.relu(out)


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.block = Block(4, 6, 2)
        self.linear = nn.Linear(6, 5)

    def forward(self, x):
        out = self.block(F.relu(self.bn(self.conv(x))))
        out = F.avg_pool2d(out, 4)
        return self.linear(out.view(out.size(0), -1))


MODELS = [(LeNet, (1, 12, 12), 1e-5), (TinyResNet, (3, 8, 8), 1e-4)]


@pytest.mark.parametrize("strategy", ["vmap", "loop"])
@pytest.mark.parametrize(("make", "sample", "tol"), MODELS, ids=["lenet", "resnet"])
def test_batch_module_trains_each_member_as_its_own_model(make, sample, tol, strategy):
    """torchmb's model tests in one: forward, backward, one member's loss, an SGD step."""
    torch.manual_seed(1)
    plain = [make() for _ in range(G)]
    bm = BatchModule(make(), G, False, strategy=strategy)
    bm.load_state_dicts([m.state_dict() for m in plain])
    x = torch.randn(G, B, *sample)

    def run():
        xs, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        separate = torch.stack([m(xi) for m, xi in zip(plain, xs, strict=True)])
        together = split_batch(bm(merge_batch(xb), merge=False, split=False), G)
        return xs, xb, separate, together

    xs, xb, separate, together = run()
    close(together, separate, tol)
    separate[1].sum().backward()
    together[1].sum().backward()
    close(xb.grad[1], xs.grad[1], tol)
    assert not xb.grad[[0, 2]].any()
    for name, p in bm.named_parameters():
        close(p.grad[1], plain[1].get_parameter(name).grad, tol)
        assert not p.grad[[0, 2]].any()
    # One Nesterov SGD step on the whole batch's loss.
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5, nesterov=True) for m in plain]
    opt = torch.optim.SGD(bm.parameters(), lr=0.1, momentum=0.5, nesterov=True)
    for o in [opt, *opts]:
        o.zero_grad()
    _, _, separate, together = run()
    separate.sum().backward()
    together.sum().backward()
    for o in [opt, *opts]:
        o.step()
    for got, m in zip(bm.state_dicts(), plain, strict=True):
        for k, v in m.state_dict().items():
            close(got[k], v, tol)


@settings(max_examples=8)
@given(g=st.integers(1, 3), b=st.integers(1, 3), hidden=st.integers(1, 4), norm=st.booleans())
def test_model_batching_law_over_drawn_sizes(g, b, hidden, norm):
    """test_model_batching passes for any member count and size (eval mode, own weights)."""
    torch.manual_seed(g * 10 + b)
    layers = [nn.Conv2d(2, hidden, 3, padding=1)]
    layers += [nn.BatchNorm2d(hidden)] if norm else []
    layers += [nn.ReLU(), nn.Flatten(), nn.Linear(hidden * 16, 3)]
    test_model_batching(nn.Sequential(*layers), [(b, 2, 4, 4)], g, rtol=1e-5, atol=1e-5)


def test_batch_loss_reduces_the_samples_axis_only_as_torchmb():
    # a per-pixel loss [G, B, H, W]: torchmb's mean over B keeps [G, H, W]
    g = torch.Generator().manual_seed(0)
    out, target = (
        torch.randn(2, 3, 4, 5, 5, generator=g),
        torch.randint(0, 4, (2, 3, 5, 5), generator=g),
    )
    per_pixel = torch.stack(
        [F.cross_entropy(out[m], target[m], reduction="none") for m in range(2)]
    )
    mean = batch_loss(out, target, 2, F.cross_entropy, "mean")
    total = batch_loss(out, target, 2, F.cross_entropy, "sum")
    assert mean.shape == (2, 5, 5)
    torch.testing.assert_close(mean, per_pixel.mean(1))
    torch.testing.assert_close(total, per_pixel.sum(1))
