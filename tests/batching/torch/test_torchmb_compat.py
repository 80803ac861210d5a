"""The torchmb shim: README examples as written, per-member laws, the checked fast path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812
from torch import nn  # noqa: E402

from dualtrain.errors import (  # noqa: E402
    ArgumentError,
    RegisteredModuleError,
    ShapeError,
)
from dualtrain_torch.compat import torchmb  # noqa: E402
from dualtrain_torch.compat.torchmb import (  # noqa: E402
    AbstractBatchModule,
    BatchModule,
    batch_loss,
    batch_topk,
    register_batch_module,
)
from tests.batching.builders import recipes, torch_module  # noqa: E402

TIGHT = {"rtol": 1e-10, "atol": 1e-12}
STEPPED = {"rtol": 1e-7, "atol": 1e-9}


class LeNet(nn.Module):
    """torchmb's test LeNet (tests/lenet.py there), 28x28 one-channel images."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, 6, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10)
        )

    def forward(self, x):
        x = self.layers(x)
        x = x.view(x.shape[0], -1)
        return self.classifier(x)


@pytest.fixture(autouse=True)
def _registry():
    """Each test registers into a registry restored afterwards."""
    saved = dict(torchmb.BATCH_MODULES)
    yield
    torchmb.BATCH_MODULES.clear()
    torchmb.BATCH_MODULES.update(saved)


# -- torchmb's README, as written (sizes small, `batch_mode` typo and all fixed) --------------


def test_readme_model_batching_forward_loss_topk_backward():
    torch.manual_seed(0)
    model_batch_size = 4
    batch_model = BatchModule(LeNet(), batch=model_batch_size)
    image_batch_size = 3
    batch_input = torch.randn(model_batch_size, image_batch_size, 1, 28, 28)
    batch_output = batch_model(batch_input)
    assert batch_output.shape == (model_batch_size, image_batch_size, 10)

    batch_inputs, batch_targets = batch_output, torch.randint(0, 10, (4, 3))
    loss_func = nn.functional.cross_entropy
    losses = batch_loss(batch_inputs, batch_targets, model_batch_size, loss_func, "mean")
    assert losses.shape == (model_batch_size,)
    accs = batch_topk(batch_inputs, batch_targets, model_batch_size, (1, 5))
    assert accs.shape == (2, model_batch_size)
    losses.sum().backward()

    # Members are identical copies (torchmb's semantics): the same weights, so each member's
    # output is the single model's on its slice, and gradients are its own loss's.
    single = LeNet()
    single.load_state_dict(batch_model.state_dicts()[2])
    torch.testing.assert_close(batch_output[2], single(batch_input[2]))
    loss_func(single(batch_input[2]), batch_targets[2]).backward()
    torch.testing.assert_close(
        batch_model.get_parameter("layers.0.weight").grad[2], single.layers[0].weight.grad
    )
    for i in range(model_batch_size):
        ref = loss_func(batch_output[i], batch_targets[i])
        torch.testing.assert_close(losses[i], ref)
        top = batch_output[i].topk(5, -1).indices
        assert accs[1, i] == (top == batch_targets[i, :, None]).any(-1).float().mean()


class MyModule(nn.Module):
    """The README's custom module: a per-channel scale (any module of the user's)."""

    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, features))

    def forward(self, x):
        return x * self.scale


calls = {"MyBatchModule": 0}


def test_readme_extending_the_model_batcher():
    from torch import Tensor

    class MyBatchModule(AbstractBatchModule):
        base_class = MyModule

        @classmethod
        def from_module(cls, module: MyModule, batch: int) -> MyBatchModule:  # type: ignore[override]
            return cls(batch, module.scale.shape[0])

        def __init__(self, batch: int, features: int):
            super().__init__(batch)
            self.scale = nn.Parameter(torch.empty(batch, features))

        def forward(self, batch_inputs: Tensor) -> Tensor:
            calls["MyBatchModule"] += 1
            # Rows are in (image, model) dictionary order: row b * batch + g.
            x = batch_inputs.reshape(-1, self.batch, batch_inputs.shape[-1])
            return (x * self.scale).reshape(batch_inputs.shape)

    register_batch_module(MyModule)  # the README registers the base class

    assert torchmb.BATCH_MODULES[MyModule] is MyBatchModule
    calls["MyBatchModule"] = 0
    model = nn.Sequential(nn.Linear(3, 5), MyModule(5), nn.Tanh(), nn.Linear(5, 2))
    bm = BatchModule(model, batch=3)
    x = torch.randn(3, 4, 3)
    out = bm(x)
    assert calls["MyBatchModule"] >= 2  # checked once, then run
    torch.testing.assert_close(out, torch.stack([model(x[i]) for i in range(3)]))
    assert "MyBatchModule" in bm.explain() and "checked" in bm.explain()


# -- per-member laws ----------------------------------------------------------------------


@settings(max_examples=6)
@given(
    recipe=recipes.filter(lambda r: not r.dropout),
    n=st.integers(1, 3),
    b=st.integers(2, 3),
    seed=st.integers(0, 2**16),
)
def test_members_train_as_separate_models(recipe, n, b, seed):
    """Loaded with N models' weights, forward, loss, gradients, BatchNorm statistics and
    two SGD steps with momentum equal N separate models."""
    torch.manual_seed(seed)
    models = [torch_module(recipe).train() for _ in range(n)]
    bm = BatchModule(models[0], n, strategy="vmap", check_isolation=False)
    bm.load_state_dicts([m.state_dict() for m in models])
    make = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)  # noqa: E731
    opts, bopt = [make(m.parameters()) for m in models], make(bm.parameters())
    g = torch.Generator().manual_seed(seed)
    for step in range(2):
        tol = TIGHT if step == 0 else STEPPED
        x = torch.randn(n, b, *recipe.input_shape(), generator=g, dtype=torch.float64)
        y = torch.randint(0, recipe.classes, (n, b), generator=g)
        out = bm(x)
        losses = batch_loss(out, y, n)
        bopt.zero_grad()
        losses.sum().backward()
        for i, (m, opt) in enumerate(zip(models, opts, strict=True)):
            ref = m(x[i])
            torch.testing.assert_close(out[i], ref, **tol)
            loss = F.cross_entropy(ref, y[i])
            torch.testing.assert_close(losses[i], loss, **tol)
            opt.zero_grad()
            loss.backward()
            for name, p in m.named_parameters():
                torch.testing.assert_close(bm.get_parameter(name).grad[i], p.grad, **tol)
            opt.step()
        bopt.step()
    for got, m in zip(bm.state_dicts(), models, strict=True):
        for name, value in m.state_dict().items():
            torch.testing.assert_close(got[name], value, **STEPPED)


@settings(max_examples=10)
@given(
    n=st.integers(1, 3),
    b=st.integers(1, 3),
    order=st.sampled_from(["g b", "b g", "(g b)", "(b g)"]),
)
def test_every_data_order_and_merge_split_flag_agree(n, b, order):
    torch.manual_seed(n * 10 + b)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    bm = BatchModule(model, n, strategy="vmap", check_isolation=False)
    x = torch.randn(n, b, 3, dtype=torch.float64)  # [G, B, ...]
    ref = bm(x)
    laid = {
        "g b": x,
        "b g": x.transpose(0, 1),
        "(g b)": x.reshape(n * b, 3),
        "(b g)": x.transpose(0, 1).reshape(n * b, 3),
    }
    back = {
        "g b": lambda t: t,
        "b g": lambda t: t.transpose(0, 1),
        "(g b)": lambda t: t.reshape(n, b, 2),
        "(b g)": lambda t: t.reshape(b, n, 2).transpose(0, 1),
    }
    torch.testing.assert_close(back[order](bm(laid[order], data_order=order)), ref, **TIGHT)
    merged = torchmb.merge_batch(x)
    assert torch.equal(merged, laid["(b g)"])
    assert torch.equal(torchmb.split_batch(merged, n), x)
    out = bm(merged, merge=False, split=False)
    torch.testing.assert_close(torchmb.split_batch(out, n), ref, **TIGHT)


def test_batch_loss_keeps_torchmbs_kwargs_and_reductions():
    g = torch.Generator().manual_seed(1)
    out, y = torch.randn(3, 5, 4, generator=g), torch.randint(0, 4, (3, 5), generator=g)
    w = torch.tensor([1.0, 2.0, 0.5, 1.0])
    none = batch_loss(out, y, None, F.cross_entropy, "none", weight=w)
    ref = torch.stack([F.cross_entropy(out[i], y[i], weight=w, reduction="none") for i in range(3)])
    torch.testing.assert_close(none, ref)
    torch.testing.assert_close(
        batch_loss(out, y, 3, F.cross_entropy, "mean", weight=w), ref.mean(1)
    )
    torch.testing.assert_close(
        batch_loss(out, y, 3, reduction="sum"),
        torch.stack([F.cross_entropy(out[i], y[i], reduction="sum") for i in range(3)]),
    )
    counts = torchmb.batch_accuracy(out, y, 3, k=(1, 4), count=True)
    assert counts.dtype == torch.int64 and counts[1].tolist() == [5, 5, 5]
    with pytest.raises(ArgumentError, match="reduction must be one of"):
        batch_loss(out, y, 3, reduction="max")


# -- the registered fast path ---------------------------------------------------------------


class Affine(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, features) / features)
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return x @ self.weight.T + self.bias


def _batch_affine(order="(b g)", detach=False):
    """A batch module for Affine; `order` wrong or `detach` makes it a wrong one."""

    class BatchAffine(AbstractBatchModule):
        base_class = Affine
        runs = 0

        @classmethod
        def from_module(cls, module, batch):
            return cls(batch, module.weight.shape[0])

        def __init__(self, batch, features):
            super().__init__(batch)
            self.weight = nn.Parameter(torch.empty(batch, features, features))
            self.bias = nn.Parameter(torch.empty(batch, features))

        def forward(self, x):
            type(self).runs += 1
            f = x.shape[-1]
            if order == "(b g)":
                h = x.reshape(-1, self.batch, f).transpose(0, 1)  # [G, B, f]
            else:  # the mistake: reads rows member-major
                h = x.reshape(self.batch, -1, f)
            w = self.weight.detach() if detach else self.weight
            out = torch.baddbmm(self.bias[:, None, :], h, w.transpose(1, 2))
            return out.transpose(0, 1).reshape(x.shape)

    return BatchAffine


def test_a_correct_registered_module_is_used_and_checked():
    batch_affine = register_batch_module(_batch_affine())  # the decorator form returns it
    torch.manual_seed(0)
    model = nn.Sequential(Affine(4), nn.ReLU(), nn.Linear(4, 3), Affine(3)).double()
    bm = BatchModule(model, 3)
    bm.load_state_dicts([torch_state(model, s) for s in range(3)])
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    out = bm(x)
    assert batch_affine.runs == 4  # each Affine: once checked, once run
    separate = []
    for i, sd in enumerate(bm.state_dicts()):
        m = nn.Sequential(Affine(4), nn.ReLU(), nn.Linear(4, 3), Affine(3)).double()
        m.load_state_dict(sd)
        separate.append(m(x[i]))
    torch.testing.assert_close(out, torch.stack(separate), **TIGHT)
    out.square().sum().backward()
    assert bm.get_parameter("0.weight").grad.shape == (3, 4, 4)
    bm(x)
    assert batch_affine.runs == 6  # no second check


def torch_state(model, seed):
    torch.manual_seed(seed)
    return {k: torch.randn_like(v) for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    ("wrong", "what"),
    [({"order": "(g b)"}, "outputs"), ({"detach": True}, "the gradient of weight")],
)
def test_a_wrong_registered_module_is_refused_naming_it(wrong, what):
    register_batch_module(_batch_affine(**wrong))
    model = nn.Sequential(nn.Linear(2, 4), Affine(4)).double()
    bm = BatchModule(model, 3)
    bm.load_state_dicts([torch_state(model, s) for s in range(3)])
    before = {k: v.clone() for k, v in bm.state_dict().items()}
    with pytest.raises(
        RegisteredModuleError, match=rf"BatchAffine \(registered for Affine, at child '1'\).*{what}"
    ):
        bm(torch.randn(3, 2, 2, dtype=torch.float64))
    for k, v in bm.state_dict().items():
        assert torch.equal(v, before[k])


def test_a_whole_registered_module_without_parameters_runs_as_torchmbs_test():
    class Dummy(nn.Module):
        def forward(self, x):
            return torch.zeros_like(x)

    @register_batch_module
    class BatchDummy(AbstractBatchModule):
        base_class = Dummy

        def forward(self, x):
            return torch.zeros_like(x)

    bm = BatchModule(Dummy(), 5)
    x = torch.ones(5, 3, 16, 16)
    torch.testing.assert_close(BatchDummy.from_module(Dummy(), 5)(x), bm(x))


def test_registered_module_without_the_base_tensors_is_refused():
    @register_batch_module
    class Lacking(AbstractBatchModule):
        base_class = Affine

        @classmethod
        def from_module(cls, module, batch):
            out = cls(batch)
            out.weight = nn.Parameter(torch.empty(batch, 2, 2))
            return out

    with pytest.raises(RegisteredModuleError, match=r"Lacking .* lacks \['bias'\]"):
        BatchModule(Affine(2), 2)


def test_register_refusals():
    class Lonely(nn.Module):
        pass

    with pytest.raises(ArgumentError, match="base_class = Lonely; found none"):
        register_batch_module(Lonely)
    with pytest.raises(ArgumentError, match="base_class names the module class"):
        register_batch_module(AbstractBatchModule)
    with pytest.raises(ArgumentError, match="cls must be"):
        register_batch_module(3)
    assert torchmb.register_module is register_batch_module


def _define_batch_lonely(base, name):
    return type(name, (AbstractBatchModule,), {"base_class": base, "__qualname__": name})


def test_register_by_base_class_takes_a_redefinition_and_refuses_two_classes():
    class Base(nn.Module):
        pass

    first = _define_batch_lonely(Base, "BatchBase")
    again = _define_batch_lonely(Base, "BatchBase")  # a notebook cell run twice
    assert register_batch_module(Base) is Base
    assert torchmb.BATCH_MODULES[Base] is again and again is not first
    _define_batch_lonely(Base, "OtherBatchBase")
    with pytest.raises(ArgumentError, match=r"found \['BatchBase', 'OtherBatchBase'\]"):
        register_batch_module(Base)


# -- bad inputs and state dicts -------------------------------------------------------------


_LINEAR = {"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda bm: bm(torch.randn(2, 4, 3)), ShapeError, r"\[G, B, \.\.\.\] with G=batch=3"),
        (lambda bm: bm(torch.randn(4, 2, 3), data_order="b g"), ShapeError, r"\[B, G, \.\.\.\]"),
        (lambda bm: bm(torch.randn(7, 3), merge=False), ShapeError, "multiple of batch=3"),
        (
            lambda bm: bm(torch.randn(3, 4, 3), data_order="gb"),
            ArgumentError,
            "data_order must be one of",
        ),
        (lambda bm: bm([1.0]), ArgumentError, r"x\[0\] must be a tensor"),
        (lambda bm: bm(), ArgumentError, "at least one input"),
        (lambda bm: BatchModule(nn.Linear(3, 2), 0), ArgumentError, "batch must be a positive int"),
        (
            lambda bm: BatchModule("net", 2),  # type: ignore[arg-type]
            ArgumentError,
            "model must be a torch nn.Module",
        ),
        (lambda bm: BatchModule(nn.Linear(3, 2), 2, True, print), ArgumentError, "replace_func"),
        (lambda bm: BatchModule(nn.ReLU(), 2, strategy="fast"), ArgumentError, "strategy must be"),
        (
            lambda bm: bm.load_state_dicts([{}] * 2),
            ArgumentError,
            r"3 state dicts \(one per member, or fewer",
        ),
        (
            lambda bm: bm.load_state_dicts({"weight": torch.zeros(2, 3)}),
            ArgumentError,
            r"lacks \['bias'\]",
        ),
        (
            lambda bm: bm.load_state_dicts({"weight": torch.zeros(3, 3), "bias": torch.zeros(2)}),
            ShapeError,
            "weight",
        ),
        # Keys and shapes were read from the first dict: a later dict's extra key was dropped
        # without a word, a missing one raised a bare KeyError, a shape a bare RuntimeError.
        (
            lambda bm: bm.load_state_dicts(
                [dict(_LINEAR), dict(_LINEAR), dict(_LINEAR, extra=torch.zeros(1))]
            ),
            ArgumentError,
            r"state_dict_or_dicts\[2\] must have the keys of .*has \['extra'\] beyond",
        ),
        (
            lambda bm: bm.load_state_dicts(
                [dict(_LINEAR), {"weight": torch.zeros(2, 3)}, dict(_LINEAR)]
            ),
            ArgumentError,
            r"state_dict_or_dicts\[1\] must have the keys of .*lacks \['bias'\]",
        ),
        (
            lambda bm: bm.load_state_dicts(
                [dict(_LINEAR), dict(_LINEAR, bias=torch.zeros(3)), dict(_LINEAR)]
            ),
            ShapeError,
            r"state_dict_or_dicts\[1\]\['bias'\] must have the shape .* \(2,\); got \(3,\)",
        ),
    ],
)
def test_bad_inputs_are_refused_clearly(call, error, match):
    bm = BatchModule(nn.Linear(3, 2), 3, strategy="vmap")
    before = {k: v.clone() for k, v in bm.state_dict().items()}
    with pytest.raises(error, match=match):
        call(bm)
    for k, v in bm.state_dict().items():
        assert torch.equal(v, before[k])


def test_state_dicts_round_trip_and_padding():
    models = [nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)) for _ in range(3)]
    for i, m in enumerate(models):
        m[1].running_mean.fill_(float(i))
    bm = BatchModule(models[0], 3)
    assert list(bm.state_dict()) == list(models[0].state_dict())  # torchmb's keys
    bm.load_state_dicts([m.state_dict() for m in models])
    for sd, m in zip(bm.state_dicts(), models, strict=True):
        for k, v in m.state_dict().items():
            assert torch.equal(sd[k], v)
    bm.load_state_dicts([models[2].state_dict()], batch_strict=False)  # the rest zero-filled
    sds = bm.state_dicts()
    assert torch.equal(sds[0]["0.weight"], models[2][0].weight)
    assert not sds[1]["0.weight"].any() and not sds[2]["1.running_mean"].any()
    bm.load_state_dicts(models[1].state_dict())  # one dict: every member
    assert all(
        torch.equal(sd["1.running_mean"], models[1][1].running_mean) for sd in bm.state_dicts()
    )
    assert bm.native is not None and torch.equal(
        bm.native.extract(0)[0].weight, models[1][0].weight
    )


def test_to_train_and_optimizers_reach_the_shared_tensors():
    register_batch_module(_batch_affine())
    model = nn.Sequential(Affine(3), nn.Dropout(0.5))
    bm = BatchModule(model, 2).double()  # in training: the check runs with dropout off
    assert all(t.dtype == torch.float64 for t in bm.state_dict().values())
    out = bm(torch.randn(2, 4, 3, dtype=torch.float64))
    assert out.dtype == torch.float64
    opt = torch.optim.SGD(bm.parameters(), lr=1.0)
    out.sum().backward()
    opt.step()
    assert torch.equal(bm.native.extract(1)[0].weight, bm.get_parameter("0.weight")[1])
    bm.eval()
    assert not bm.native.training and not bm.native.extract(0).training
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    torch.testing.assert_close(bm(x)[1], bm.native.extract(1)(x[1]), **TIGHT)


class BatchConv2d(AbstractBatchModule):
    """torchmb's way for Conv2d: members folded into channels, one grouped conv."""

    base_class = nn.Conv2d

    @classmethod
    def from_module(cls, module, batch):
        return cls(batch, module)

    def __init__(self, batch, conv):
        super().__init__(batch)
        self.padding = conv.padding
        self.weight = nn.Parameter(torch.empty(batch, *conv.weight.shape))
        self.bias = nn.Parameter(torch.empty(batch, *conv.bias.shape))

    def forward(self, x):  # [(b g), c, h, w] -> [b, (g c), h, w]
        g, c = self.batch, x.shape[1]
        h = x.reshape(-1, g * c, *x.shape[2:])
        w = self.weight.reshape(-1, *self.weight.shape[2:])
        out = F.conv2d(h, w, self.bias.reshape(-1), padding=self.padding, groups=g)
        return out.reshape(-1, out.shape[1] // g, *out.shape[2:])


def test_a_grouped_conv_fast_path_in_nested_sequentials_passes_in_float32():
    register_batch_module(BatchConv2d)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU()),
        nn.Conv2d(4, 3, 3),
        nn.Flatten(),
        nn.Linear(3 * 4 * 4, 2),
    )
    bm = BatchModule(model, 3)
    bm.load_state_dicts([torch_state(model, s) for s in range(3)])
    x = torch.randn(3, 2, 1, 6, 6)
    out = bm(x)
    assert "BatchConv2d (registered for Conv2d, at child '0.0')" in bm.explain()
    assert "BatchConv2d (registered for Conv2d, at child '1')" in bm.explain()
    for i, sd in enumerate(bm.state_dicts()):
        model.load_state_dict(sd)
        torch.testing.assert_close(out[i], model(x[i]), rtol=1e-5, atol=1e-5)


def test_a_registered_module_with_several_inputs_and_outputs():
    """torchmb's test_test_mimo_module: tuples in, tuples out, in every data order."""

    class MIMO(nn.Module):
        def forward(self, x, y):
            return x + y, x - y

    @register_batch_module
    class BatchMIMO(AbstractBatchModule):
        base_class = MIMO

        def forward(self, x, y):
            return x + y, x - y

    bm = BatchModule(MIMO(), 5)
    x, y = torch.randn(5, 3, 4), torch.randn(5, 3, 4)
    u, v = bm(x, y)
    torch.testing.assert_close(u, x + y)
    torch.testing.assert_close(v, x - y)
    u, v = bm(x.transpose(0, 1), y.transpose(0, 1), data_order="b g")
    torch.testing.assert_close(u, (x + y).transpose(0, 1))
