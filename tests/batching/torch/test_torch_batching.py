"""torch BatchModule: the batched members behave as N separate models (laws), and refusals."""

# ruff: noqa: E501 (the refusal table keeps one case per line)

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812
from torch import nn  # noqa: E402

import dualtrain_torch  # noqa: E402
from dualtrain.batching import CACHE, member_seeds  # noqa: E402
from dualtrain.errors import ArgumentError, IsolationError, ShapeError  # noqa: E402
from dualtrain_torch.batching import BatchModule, batch_loss, batch_topk  # noqa: E402
from tests.batching.builders import RecipeNet, recipes, torch_module  # noqa: E402

STRATEGIES = ("vmap", "chunked", "loop")
TIGHT = {"rtol": 1e-10, "atol": 1e-12}
# After optimizer steps: Adam divides by sqrt(v), which magnifies rounding where a gradient
# is nearly 0 (BatchNorm over two samples), so a step compares less tightly, still float64.
STEPPED = {"rtol": 1e-7, "atol": 1e-9}


def _separate(recipe, n, seed):
    torch.manual_seed(seed)
    return [torch_module(recipe) for _ in range(n)]


def _data(recipe, n, b, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, b, *recipe.input_shape(), generator=g, dtype=torch.float64)
    y = torch.randint(0, recipe.classes, (n, b), generator=g)
    return x, y


@settings(max_examples=8)
@given(
    recipe=recipes,
    n=st.integers(1, 3),
    b=st.integers(2, 4),
    strategy=st.sampled_from(STRATEGIES),
    optimizer=st.sampled_from(["sgd", "adam"]),
    seed=st.integers(0, 2**16),
)
def test_training_equals_a_loop_over_separate_models(recipe, n, b, strategy, optimizer, seed):
    """Forward, per-member loss, gradients and K optimizer steps (BatchNorm statistics
    included) are those of N separate models stepped one by one."""
    models = _separate(recipe, n, seed)
    bm = BatchModule.from_modules(models, strategy=strategy, check_isolation=False)
    for m in models:
        m.train()
        for mod in m.modules():  # dropout draws differ by design: compare with it off
            if isinstance(mod, nn.Dropout):
                mod.eval()
    for mod in bm._template.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0
    make = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        # eps well above rounding: a gradient that cancels to ~0 (BatchNorm over two
        # samples) would otherwise turn rounding into an lr-sized step (Hypothesis found an
        # 8e-8 difference after two steps at the default 1e-8)
        "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, eps=1e-4),
    }[optimizer]
    opts = [make(m.parameters()) for m in models]
    bopt = make(bm.parameters())
    for step in range(2):
        x, y = _data(recipe, n, b, seed + step)
        out = bm(x)
        losses = batch_loss(out, y, n)
        bopt.zero_grad()
        losses.sum().backward()
        for i, (m, opt) in enumerate(zip(models, opts, strict=True)):
            ref = m(x[i])
            tol = TIGHT if step == 0 else STEPPED
            torch.testing.assert_close(out[i], ref, **tol)
            loss = F.cross_entropy(ref, y[i])
            torch.testing.assert_close(losses[i], loss, **tol)
            opt.zero_grad()
            loss.backward()
            for name, p in m.named_parameters():
                grad = bm.stack.get_parameter(name).grad[i]
                torch.testing.assert_close(grad, p.grad, **(TIGHT if step == 0 else STEPPED))
            opt.step()
        bopt.step()
    for i, m in enumerate(models):
        got = bm.extract(i).state_dict()
        for name, value in m.state_dict().items():
            torch.testing.assert_close(got[name], value, **STEPPED)


@settings(max_examples=6)
@given(recipe=recipes, n=st.integers(2, 5), seed=st.integers(0, 2**16), shared=st.booleans())
def test_every_strategy_gives_the_same_outputs_and_gradients(recipe, n, seed, shared):
    torch.manual_seed(seed)
    module = torch_module(recipe).eval()
    x, _ = _data(recipe, n, 3, seed)
    x = x[0] if shared else x
    results = []
    for strategy in STRATEGIES:
        bm = BatchModule(module, n, seed=seed, shared_input=shared, strategy=strategy)
        bm.eval()
        out = bm(x)
        grads = torch.autograd.grad((out * out).sum(), list(bm.parameters()))
        results.append((out, grads))
    for out, grads in results[1:]:
        torch.testing.assert_close(out, results[0][0], **TIGHT)
        for g, g0 in zip(grads, results[0][1], strict=True):
            torch.testing.assert_close(g, g0, **TIGHT)


@settings(max_examples=6)
@given(recipe=recipes, n=st.integers(1, 4), index=st.integers(0, 3), seed=st.integers(0, 99))
def test_extract_of_insert_is_the_module_inserted(recipe, n, index, seed):
    bm = BatchModule(torch_module(recipe), n, seed=seed, check_isolation=False)
    torch.manual_seed(seed + 1)
    other = torch_module(recipe)
    for mod in other.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.running_mean.uniform_()
    before = [bm.extract(j).state_dict() for j in range(n)]
    i = index % n
    bm.insert(i, other)
    for j in range(n):
        got = bm.extract(j).state_dict()
        want = other.state_dict() if j == i else before[j]
        for name, value in want.items():
            assert torch.equal(got[name], value), (j, name)


def test_independent_members_of_a_craft_are_realize_with_the_member_seeds():
    from tests.batching.builders import Recipe

    craft = RecipeNet(Recipe("cnn", 3, 2, 3, norm=True, dropout=False))
    bm = BatchModule(dualtrain_torch.realize(craft, seed=0, dtype="float64"), 3, seed=11)
    assert bm.seeds == member_seeds(11, 3)
    assert len(set(bm.seeds)) == 3
    for i, s in enumerate(bm.seeds):
        want = dualtrain_torch.realize(craft, seed=s, dtype="float64").state_dict()
        got = bm.extract(i).state_dict()
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), name
    listed = BatchModule(dualtrain_torch.realize(craft), 2, seed=[5, 7])
    want = dualtrain_torch.realize(craft, seed=7).state_dict()
    assert all(torch.equal(listed.extract(1).state_dict()[k], v) for k, v in want.items())


def test_independent_init_of_a_plain_module_redraws_each_member_reproducibly():
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    a = BatchModule(module, 3, seed=4)
    b = BatchModule(module, 3, seed=4)
    c = BatchModule(module, 3, seed=5)
    w = a.stack.get_parameter("0.weight").detach()
    assert torch.equal(w, b.stack.get_parameter("0.weight"))
    assert not torch.equal(w, c.stack.get_parameter("0.weight"))
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])
    # the module's own initializer: nn.Linear's U(+-1/sqrt(fan_in)) bound holds
    assert float(w.abs().max()) <= 3**-0.5
    same = BatchModule(module, 3, init="identical")
    for i in range(3):
        assert torch.equal(same.stack.get_parameter("0.weight")[i], module[0].weight)
    assert torch.equal(module[0].weight, nn.Sequential(*module)[0].weight)  # left unchanged


def test_batchnorm_statistics_and_dropout_draws_are_per_member():
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Dropout(0.5)).double()
    bm = BatchModule(module, 3, init="identical", strategy="vmap")
    x = torch.randn(3, 8, 3, dtype=torch.float64)
    x[1] += 5.0
    out = bm(x)
    stats = bm.stack.get_buffer("1.running_mean")
    for i in range(3):
        torch.testing.assert_close(
            stats[i], 0.1 * (x[i] @ module[0].weight.T + module[0].bias).mean(0)
        )
    assert torch.equal(
        bm.stack.get_buffer("1.num_batches_tracked"), torch.ones(3, dtype=torch.long)
    )
    shared = BatchModule(module, 3, init="identical", shared_input=True, strategy="vmap")
    drops = shared(torch.ones(16, 3, dtype=torch.float64)) == 0
    assert not torch.equal(drops[0], drops[1]) and not torch.equal(drops[1], drops[2])
    assert out.shape == (3, 8, 4)


def test_an_optimizer_over_parameters_steps_every_member():
    bm = BatchModule(nn.Linear(3, 2), 4)
    assert [tuple(p.shape) for p in bm.parameters()] == [(4, 2, 3), (4, 2)]
    assert all(p.is_leaf for p in bm.parameters())
    before = [p.detach().clone() for p in bm.parameters()]
    opt = torch.optim.SGD(bm.parameters(), lr=0.1)
    batch_loss(bm(torch.randn(4, 5, 3)), torch.zeros(4, 5, dtype=torch.long), 4).sum().backward()
    opt.step()
    for p, q in zip(bm.parameters(), before, strict=True):
        assert all(not torch.equal(p[i], q[i]) for i in range(4))


def test_auto_measures_once_caches_by_key_and_explains():
    CACHE.clear()
    module = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    bm = BatchModule(module, 4)
    assert "not chosen yet" in bm.explain()
    x = torch.randn(4, 5, 3)
    out = bm(x)
    text = bm.explain()
    assert "(measured)" in text and "<- chosen" in text and "passed" in text
    decision = bm._decision
    offered = {*STRATEGIES, "stacked"}  # a Sequential of Linear and Tanh: stacked too
    assert decision.strategy in offered and set(decision.timings) == offered
    assert len(CACHE) == 1
    again = BatchModule(module, 4)
    again(x)
    assert "(cached)" in again.explain() and again._decision.strategy == decision.strategy
    forced = BatchModule(module, 4, strategy="loop", seed=0)
    torch.testing.assert_close(forced(x), out)
    assert "loop (forced)" in forced.explain()


def test_a_memory_budget_splits_the_members_into_chunks():
    module = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    x = torch.randn(6, 5, 3, dtype=torch.float64)
    whole = BatchModule(module, 6, strategy="vmap")
    tight = BatchModule(module, 6, strategy="vmap", memory_budget=4000)
    torch.testing.assert_close(tight(x), whole(x), **TIGHT)
    assert tight._decision.strategy == "chunked" and 1 <= tight._decision.chunk < 6
    with pytest.raises(ArgumentError, match=r"memory_budget must hold at least one member"):
        BatchModule(module, 6, memory_budget=10)(x)


def test_batch_loss_and_topk_are_per_member():
    out = torch.tensor([[[3.0, 1.0, 2.0], [0.0, 1.0, 5.0]], [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]])
    y = torch.tensor([[0, 1], [0, 0]])
    acc = batch_topk(out, y, 2, ks=(1, 2, 9))
    torch.testing.assert_close(acc, torch.tensor([[0.5, 0.5], [1.0, 0.5], [1.0, 1.0]]))
    shared = batch_topk(out, torch.tensor([0, 1]), 2, ks=1)
    torch.testing.assert_close(shared, torch.tensor([[0.5, 0.0]]))
    loss = batch_loss(out, y, 2, reduction="sum")
    torch.testing.assert_close(loss[1], F.cross_entropy(out[1], y[1], reduction="sum"))
    none = batch_loss(out, y, 2, loss_fn=F.cross_entropy, reduction="none")
    assert none.shape == (2, 2)
    mse = batch_loss(out, torch.zeros(2, 3), 2, loss_fn=F.mse_loss)
    torch.testing.assert_close(mse[0], F.mse_loss(out[0], torch.zeros(2, 3)))


class UnregisteredStats(nn.Module):
    """Keeps a running mean in a plain tensor attribute: the members share it."""

    def __init__(self):
        super().__init__()
        self.avg = torch.zeros(2)

    def forward(self, x):
        self.avg = 0.9 * self.avg + 0.1 * x.detach().mean(0)
        return x - self.avg


def test_a_module_that_mixes_members_is_refused_naming_it():
    leaky = nn.Sequential(nn.Linear(3, 2), UnregisteredStats(), nn.Linear(2, 2))
    bm = BatchModule(leaky, 2, strategy="loop")
    with pytest.raises(IsolationError, match=r"strategy 'loop'.*module '1' \(UnregisteredStats\)"):
        bm(torch.randn(2, 4, 3))
    measured = BatchModule(leaky, 4)  # auto: vmap leaves the attribute with a member axis
    with pytest.raises(IsolationError, match=r"ran every member, then failed on the isolation"):
        measured(torch.randn(4, 4, 3))
    quiet = BatchModule(leaky, 2, strategy="loop", check_isolation=False)
    assert quiet(torch.randn(2, 4, 3)).shape == (2, 4, 2)


class LeaksInTraining(UnregisteredStats):
    def forward(self, x):
        return super().forward(x) if self.training else x - self.avg


def test_each_mode_and_strategy_is_probed_on_its_first_call():
    bm = BatchModule(nn.Sequential(nn.Linear(3, 2), LeaksInTraining()), 2, strategy="loop")
    bm.eval()
    assert bm(torch.randn(2, 4, 3)).shape == (2, 4, 2)  # no leak in eval
    assert "passed (loop" in bm.explain()
    bm.train()
    with pytest.raises(IsolationError, match=r"LeaksInTraining"):
        bm(torch.randn(2, 4, 3))


def test_isolation_holds_for_batchnorm_in_training():
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).train()
    for strategy in STRATEGIES:
        bm = BatchModule(module, 3, strategy=strategy)
        bm(torch.randn(3, 5, 3))
        assert "passed" in bm.explain()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m: BatchModule(m, 0), ArgumentError, r"batch must be a positive int; got batch=0"),
        (lambda m: BatchModule(m, True), ArgumentError, r"batch must be a positive int"),
        (lambda m: BatchModule(m, 2, strategy="fast"), ArgumentError, r"strategy must be one of \('auto', 'vmap', 'chunked', 'loop', 'stacked'\); got strategy='fast'"),
        (lambda m: BatchModule(m, 2, init="same"), ArgumentError, r"init must be one of"),
        (lambda m: BatchModule(m, 2, seed=-1), ArgumentError, r"seed must be an int in \[0, 2\*\*64\)"),
        (lambda m: BatchModule(m, 2, seed=[1]), ArgumentError, r"seed must be an int or a sequence of batch=2 ints"),
        (lambda m: BatchModule(m, 2, memory_budget=0), ArgumentError, r"memory_budget must be a positive int"),
        (lambda m: BatchModule(m, 2, shared_input=1), ArgumentError, r"shared_input must be a bool"),
        (lambda m: BatchModule("net", 2), ArgumentError, r"module must be a torch nn.Module"),
        (lambda m: BatchModule(nn.ReLU(), 2), ArgumentError, r"at least one parameter"),
        (lambda m: BatchModule(m, 2)(torch.randn(3, 4, 3)), ShapeError, r"inputs\[0\] must have the member count as its leading dimension, \[batch, B, ...\] with batch=2; got inputs\[0\] of shape \(3, 4, 3\)"),
        (lambda m: BatchModule(m, 2).extract(2), ArgumentError, r"index must be an int in \[-2, 1\]; got index=2"),
        (lambda m: BatchModule.from_modules([m, nn.Linear(3, 5)]), ArgumentError, r"modules\[1\] must have the first member's architecture; weight is a float32 parameter of shape \(5, 3\)"),
        (lambda m: BatchModule.from_modules([m, nn.Sequential(nn.Linear(3, 2))]), ArgumentError, r"modules\[1\] must have the first member's architecture; it is a Sequential, the first member a Linear"),
        (lambda m: BatchModule.from_modules([]), ArgumentError, r"modules must be a non-empty list"),
        (lambda m: BatchModule(m, 2).insert(0, nn.Linear(4, 2)), ArgumentError, r"module must have the first member's architecture"),
        (lambda m: batch_loss(torch.zeros(3, 2, 4), torch.zeros(3, 2, dtype=torch.long), 2), ShapeError, r"outputs must have the member count"),
        (lambda m: batch_loss(torch.zeros(2, 2, 4), torch.zeros(5, dtype=torch.long), 2), ShapeError, r"targets must be \[batch, B, ...\] or \[B, ...\]"),
        (lambda m: batch_loss(torch.zeros(2, 2, 4), torch.zeros(2, 2, dtype=torch.long), 2, reduction="avg"), ArgumentError, r"reduction must be one of"),
        (lambda m: batch_topk(torch.zeros(2, 2, 4), torch.zeros(2, 2, dtype=torch.long), 2, ks=(0,)), ArgumentError, r"ks must be a non-empty sequence of positive ints"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_the_argument_the_value_and_what_was_expected(
    call, error, message
):
    with pytest.raises(error, match=message):
        call(nn.Linear(3, 2))


def test_a_plain_module_without_reset_parameters_cannot_be_drawn_independently():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.w

    with pytest.raises(
        ArgumentError, match=r"init must be 'identical' or BatchModule.from_modules.*\[''\]"
    ):
        BatchModule(Scale(), 2)
    assert BatchModule(Scale(), 2, init="identical")(torch.ones(2, 1, 3)).shape == (2, 1, 3)


def test_state_dict_names_and_conversions_reach_every_member_and_the_template():
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    bm = BatchModule(module, 2, strategy="loop")
    keys = set(bm.state_dict())
    assert {"stack.0.weight", "stack.1.running_mean", "stack.1.num_batches_tracked"} <= keys
    assert bm.state_dict()["stack.0.weight"].shape == (2, 4, 3)
    copy = BatchModule(module, 2, seed=9, strategy="loop")
    copy.load_state_dict(bm.state_dict())
    assert torch.equal(copy.stack.get_parameter("0.weight"), bm.stack.get_parameter("0.weight"))
    bm.double()
    member = bm.extract(1)
    assert member[0].weight.dtype == torch.float64 and member.training
    assert bm(torch.randn(2, 5, 3, dtype=torch.float64)).dtype == torch.float64
    assert "strategy: loop (forced)" in bm.tune(torch.randn(2, 5, 3, dtype=torch.float64))


def test_parameters_take_their_gradients_layout_and_keep_their_values():
    # vmap's gradient of a Linear weight is transposed per member in memory; the parameters
    # are laid out like it on the first backward, so no step pays a strided copy.
    net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    bm = BatchModule(net, 3, strategy="vmap")
    before = {k: v.detach().clone() for k, v in bm.state_dict().items()}
    ids = [id(p) for p in bm.parameters()]
    opt = torch.optim.SGD(bm.parameters(), lr=0.1, momentum=0.9)
    bm(torch.randn(3, 2, 5)).sum().backward()
    for p in bm.parameters():
        assert p.stride() == p.grad.stride()
    assert [id(p) for p in bm.parameters()] == ids  # the optimizer's parameters still
    after = bm.state_dict()
    for name, value in before.items():
        assert torch.equal(after[name], value)
    opt.step()
    for i in range(3):  # members still run as themselves
        x = torch.randn(2, 5)
        torch.testing.assert_close(bm(torch.stack([x] * 3))[i], bm.extract(i)(x))
    bm.double()  # .to() lays them out afresh, and the next backward again
    bm(torch.randn(3, 2, 5, dtype=torch.float64)).sum().backward()
    assert all(p.stride() == p.grad.stride() for p in bm.parameters())
    assert not all(p.is_contiguous() for p in bm.parameters())
    assert all(v.is_contiguous() for v in bm.state_dict().values())  # safetensors takes it
    plain = BatchModule(net, 3, strategy="vmap")
    plain.match_gradient_layout = False  # for code that flattens with .view(-1)
    plain(torch.randn(3, 2, 5)).sum().backward()
    torch.nn.utils.parameters_to_vector(plain.parameters())
    assert all(p.grad.view(-1) is not None for p in plain.parameters())


@settings(max_examples=40)
@given(
    n=st.integers(1, 4),
    b=st.integers(1, 5),
    classes=st.integers(1, 5),
    shared=st.booleans(),
    reduction=st.sampled_from(["mean", "sum", "none"]),
    ignored=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_the_default_loss_equals_cross_entropy_member_by_member(
    n, b, classes, shared, reduction, ignored, seed
):
    """Law: batch_loss's one flat call is F.cross_entropy on each member alone, ignored
    targets (-100) included (a member with every target ignored has torch's nan mean)."""
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(n, b, classes, dtype=torch.float64, generator=g)
    y = torch.randint(0, classes, (b,) if shared else (n, b), generator=g)
    y[torch.rand(y.shape, generator=g) < ignored] = -100
    got = batch_loss(out, y, n, reduction=reduction)
    for i in range(n):
        want = torch.nn.functional.cross_entropy(out[i], y if shared else y[i], reduction=reduction)
        torch.testing.assert_close(got[i], want, rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.int64])
@pytest.mark.parametrize("rows", [0, 3])
def test_batch_loss_takes_every_id_dtype_and_an_empty_batch(dtype, rows):
    """Ids of any integer dtype give the int64 ids' losses; no rows give torch's nan per
    member (as F.cross_entropy of an empty batch), never an error."""
    out = torch.randn(2, rows, 4, dtype=torch.float64)
    ids = torch.randint(0, 4, (rows,))
    got = batch_loss(out, ids.to(dtype), 2)
    want = torch.stack([torch.nn.functional.cross_entropy(o, ids) for o in out])
    torch.testing.assert_close(got, want, equal_nan=True)
