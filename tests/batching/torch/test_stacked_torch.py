"""The "stacked" strategy: each layer once over all members, equal to vmap and to N models."""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from hypothesis import (  # noqa: E402
    given,
    settings,
    strategies as st,
)
from torch import nn  # noqa: E402

from dualtrain.batching import CACHE, dispatch  # noqa: E402
from dualtrain.errors import ArgumentError  # noqa: E402
from dualtrain_torch import member_optimizer  # noqa: E402
from dualtrain_torch.batching import BatchModule, batch_loss  # noqa: E402
from dualtrain_torch.batching.run import check_stacked, run_members, stacked_plan  # noqa: E402
from tests.helpers import CHILD_TIMEOUT_S  # noqa: E402

TIGHT = {"rtol": 1e-10, "atol": 1e-12}
ACTIVATIONS = [nn.ReLU, nn.Tanh, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Identity, nn.LeakyReLU]


@st.composite
def mlps(draw):
    """A Sequential MLP (maybe with a Flatten in front) and its input shape per sample."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=2, max_size=4))
    layers: list[nn.Module] = []
    extra = draw(st.sampled_from([(), (2,)]))  # rows per sample: Linear maps the last dim
    for a, b in itertools.pairwise(sizes):
        layers.append(nn.Linear(a, b, bias=draw(st.booleans())))
        layers.append(draw(st.sampled_from(ACTIVATIONS))())
    net = nn.Sequential(*layers[:-1])
    return net, (*extra, sizes[0])


@st.composite
def cnns(draw):
    """A Sequential CNN: Conv2d (stride, padding, dilation, groups, bias), pools, a head."""
    channels = draw(st.sampled_from([1, 2, 4]))
    out = draw(st.sampled_from([2, 4]))
    groups = draw(st.sampled_from([g for g in (1, 2) if channels % g == 0 and out % g == 0]))
    conv = nn.Conv2d(
        channels,
        out,
        draw(st.sampled_from([1, 3])),
        stride=draw(st.sampled_from([1, 2])),
        padding=draw(st.sampled_from([0, 1])),
        dilation=draw(st.sampled_from([1, 2])),
        groups=groups,
        bias=draw(st.booleans()),
    )
    pool = draw(st.sampled_from([nn.AdaptiveAvgPool2d(1), nn.AdaptiveMaxPool2d(1)]))
    net = nn.Sequential(
        conv,
        draw(st.sampled_from(ACTIVATIONS))(),
        nn.Sequential(pool, nn.Flatten()),  # nested Sequentials are planned too
        nn.Linear(out, 3),
    )
    return net, (channels, 7, 7)


def _vmap_twin(bm: BatchModule) -> BatchModule:
    twin = BatchModule(bm.extract(0), bm.batch, init="identical", strategy="vmap")
    twin.load_state_dict(bm.state_dict())
    twin.shared_input = bm.shared_input
    return twin


@settings(max_examples=20)
@given(
    model=st.one_of(mlps(), cnns()),
    n=st.integers(1, 4),
    b=st.integers(1, 3),
    shared=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_stacked_equals_vmap_outputs_and_gradients(model, n, b, shared, seed):
    """Law: for any planned Sequential, stacked and vmap give the same outputs and gradients."""
    net, shape = model
    torch.manual_seed(seed)
    net = net.double()
    bm = BatchModule(net, n, seed=seed, shared_input=shared, strategy="stacked")
    twin = _vmap_twin(bm)
    x = torch.randn(*((b,) if shared else (n, b)), *shape, dtype=torch.float64)
    out, want = bm(x), twin(x)
    torch.testing.assert_close(out, want, **TIGHT)
    cot = torch.randn_like(out)
    (out * cot).sum().backward()
    (want * cot).sum().backward()
    for (name, p), q in zip(bm.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **TIGHT, msg=name)


@settings(max_examples=10)
@given(model=mlps(), n=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_stacked_training_equals_separate_models_with_their_own_adam(model, n, seed):
    """Law: K steps of member_optimizer over the stacked strategy equal N models, each with
    torch.optim.Adam at its own learning rate (the plain sweep)."""
    net, shape = model
    torch.manual_seed(seed)
    net = net.double()
    models = [copy.deepcopy(net) for _ in range(n)]
    for m in models:
        for layer in m:
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()
    bm = BatchModule.from_modules(models, shared_input=True, strategy="stacked")
    lrs = [10.0 ** -(1 + i) for i in range(n)]
    opt = member_optimizer(bm, "adam", n, lr=lrs)
    plain = [torch.optim.Adam(m.parameters(), lr=lr) for m, lr in zip(models, lrs, strict=True)]
    g = torch.Generator().manual_seed(seed)
    for _ in range(3):
        x = torch.randn(4, *shape, dtype=torch.float64, generator=g)
        out = bm(x)
        opt.zero_grad()
        out.square().mean(dim=tuple(range(1, out.dim()))).sum().backward()
        opt.step()
        for m, o in zip(models, plain, strict=True):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    for i, m in enumerate(models):
        for (name, p), q in zip(bm.extract(i).named_parameters(), m.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-7, atol=1e-9, msg=f"member {i} {name}")


def test_pieces_it_cannot_run_are_not_planned():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x) * 2

    class Subclass(nn.Sequential):
        def forward(self, x):
            return super().forward(x) + 1

    hooked = nn.Sequential(nn.Linear(3, 2))
    hooked[0].register_forward_hook(lambda m, i, o: o * 2)
    weight_norm = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(3, 2)))
    rows, images = torch.randn(2, 4, 3), torch.randn(2, 4, 1, 5, 5)
    for module, x in (
        (Custom(), rows),
        (Subclass(nn.Linear(3, 2)), rows),
        (nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)), rows),
        (nn.Sequential(nn.Linear(3, 2), nn.PReLU()), rows),
        (nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="circular")), images),
        (hooked, rows),
        (weight_norm, rows),
    ):
        assert stacked_plan(module) is None
        with pytest.raises(ArgumentError, match=r'strategy must be .*"stacked" only for'):
            BatchModule(module, 2, strategy="stacked", init="identical")
        # "auto" measures the others and never offers stacked.
        CACHE.clear()
        bm = BatchModule(module, 2, init="identical", check_isolation=False)
        bm.tune(x)
        assert "stacked" not in bm._decision.timings


def test_a_hook_for_every_module_runs_the_generic_way():
    """Global module hooks are run by functional_call only: stacked steps aside for them."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    bm = BatchModule(net, 3, strategy="stacked")
    x = torch.randn(3, 2, 3, dtype=torch.float64)
    seen: list[str] = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda m, i, o: seen.append(type(m).__name__)
    )
    try:
        out = bm(x)
    finally:
        handle.remove()
    assert "Linear" in seen
    torch.testing.assert_close(out, _vmap_twin(bm)(x), **TIGHT)


def test_dropout_draws_differ_between_members_even_on_a_shared_input():
    net = nn.Sequential(nn.Dropout(0.5), nn.Linear(8, 8, bias=False))
    bm = BatchModule(net, 2, init="identical", shared_input=True, strategy="stacked").train()
    out = bm(torch.ones(4, 8))
    assert not torch.equal(out[0], out[1])
    bm.eval()
    out = bm(torch.ones(4, 8))
    torch.testing.assert_close(out[0], out[1])


def test_the_check_against_vmap_catches_a_wrong_answer(monkeypatch):
    """A stacked run that mixes members is refused by the check, and "auto" leaves it."""
    net = nn.Sequential(nn.Linear(3, 2))
    bm = BatchModule(net, 3, check_isolation=False)
    x = torch.randn(3, 4, 3)
    from dualtrain_torch.batching import stacked as batching_stacked

    real = batching_stacked.run
    monkeypatch.setattr(batching_stacked, "run", lambda *a: real(*a).flip(0))
    params, buffers = bm._tensors()
    found = check_stacked(bm._template, params, buffers, (x,), False)
    assert found is not None and "outputs differ from vmap's" in found
    CACHE.clear()
    bm(x)
    assert bm._decision.strategy != "stacked"
    assert "stacked  failed: refused: outputs differ" in bm.explain()
    forced = BatchModule(net, 3, strategy="stacked", check_isolation=False)
    with pytest.raises(ArgumentError, match='strategy="stacked" does not compute what vmap'):
        forced(x)
    monkeypatch.undo()
    torch.testing.assert_close(
        run_members(bm._template, "stacked", None, params, buffers, (x,), False),
        run_members(bm._template, "vmap", None, params, buffers, (x,), False),
    )


def test_a_cached_stacked_decision_needs_this_process_check():
    """The disk cache picks among strategies; stacked is used only where allowed now."""
    key = ("test-stacked-cache", 1)
    CACHE.put(key, dispatch.Decision("stacked", None, "measured", {"stacked": 1.0}))
    calls: list[str] = []

    def make_runs(options, members):
        return {name: (lambda name=name: calls.append(name)) for name in options}

    allowed = dispatch.decide("torch", "auto", 2, 2, key, make_runs, extra=("stacked",))
    assert allowed.strategy == "stacked" and allowed.reason == "cached" and not calls
    refused = dispatch.decide("torch", "auto", 2, 2, key, make_runs)
    assert refused.reason == "measured" and "stacked" not in refused.timings and calls


def test_decisions_persist_across_processes_and_clear_removes_them(tmp_path):
    """A decision measured in one process is read back ("cached") by the next."""
    program = textwrap.dedent(
        """
        import json, torch
        from torch import nn
        from dualtrain_torch import BatchModule
        bm = BatchModule(nn.Sequential(nn.Linear(3, 2)), 2, check_isolation=False)
        bm(torch.randn(2, 4, 3))
        print(json.dumps([bm._decision.strategy, bm._decision.reason]))
        """
    )
    env = {**__import__("os").environ, "DUALTRAIN_CACHE_DIR": str(tmp_path)}

    def run() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True,
            timeout=CHILD_TIMEOUT_S,
        )  # fmt: skip
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    assert first[1] == "measured"
    files = list((tmp_path / "batching").glob("*.json"))
    assert len(files) == 1
    assert run() == [first[0], "cached"]
    files[0].write_text("{ not json")  # a torn or foreign file is ignored and replaced
    assert run()[1] == "measured"
    cache = dispatch.DecisionCache(tmp_path / "batching")
    cache.clear()
    assert not list((tmp_path / "batching").glob("*.json"))


def test_an_unwritable_cache_folder_costs_only_the_timing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = dispatch.DecisionCache(blocker / "batching")
    cache.put(("k",), dispatch.Decision("vmap", None, "measured"))
    assert cache.get(("k",)).strategy == "vmap"  # memory still holds it
    assert dispatch.DecisionCache(blocker / "batching").get(("k",)) is None


def test_sweep_of_a_tiny_mlp_trains_like_the_plain_loop():
    """The documented sweep (BatchModule + member_optimizer + batch_loss) under "auto"."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    bm = BatchModule(net, 4, init="identical", shared_input=True)
    opt = member_optimizer(bm, "adam", 4, lr=[1e-3, 3e-3, 1e-2, 3e-2])
    x = torch.randn(5, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (5,))
    for _ in range(2):
        out = bm(x)
        loss = batch_loss(out, y.expand(4, 5), 4)
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
    assert bm._decision is not None and torch.isfinite(loss).all()


def test_the_whole_step_timing_changes_nothing_and_is_explained():
    """The decision's whole-step timing (an Adam on copies) leaves parameters, buffers and
    gradients as they were, and explain() reports it; inference does not time a step."""
    CACHE.clear()
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    bm = BatchModule(net, 3, check_isolation=False)
    before = {k: v.clone() for k, v in bm.state_dict().items()}
    x = torch.randn(3, 5, 4)
    bm.tune(x)
    after = bm.state_dict()
    for k, v in before.items():
        torch.testing.assert_close(after[k], v, rtol=0, atol=0, msg=k)
    assert all(p.grad is None for p in bm.parameters())
    assert bm._decision.step is not None and bm._decision.separate is not None
    assert "whole step (forward, backward, Adam)" in bm.explain()
    with torch.no_grad():
        CACHE.clear()
        quiet = BatchModule(net, 3, check_isolation=False)
        quiet.tune(x)
    assert quiet._decision.step is None and "whole step" not in quiet.explain()


def test_a_layer_repeated_in_a_sequential_runs_each_time_and_tied_weights_are_refused():
    """Sequential.forward runs a repeated entry each time: a Dropout used twice drops twice
    under stacked as under vmap; a Linear used twice (tied weights) is not planned."""
    drop = nn.Dropout(0.5)
    net = nn.Sequential(nn.Linear(8, 8), drop, nn.Linear(8, 8), drop)
    assert [s.kind for s in stacked_plan(net).steps] == [
        "linear",
        "elementwise",
        "linear",
        "elementwise",
    ]
    bm = BatchModule(net, 8, strategy="stacked", shared_input=True).train()
    out = bm(torch.rand(64, 8) + 1)
    zeroed = float((out == 0).float().mean())
    assert 0.4 < zeroed < 0.6  # the repeat at the end drops half (it was skipped: 0.0)
    lin = nn.Linear(4, 4)
    assert stacked_plan(nn.Sequential(nn.Linear(4, 4), lin, nn.Tanh(), lin)) is None


def test_a_non_finite_value_never_counts_as_agreement():
    """NaN where the other side has a number (or NaN compared as a norm) is a difference;
    NaN at the same places on both sides is agreement."""
    from dualtrain_torch.batching.stacked import _relative_gap, verify

    a = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    assert _relative_gap(a, a.clone()) == 0.0
    assert _relative_gap(a, torch.tensor([[1.0, 5.0], [2.0, 3.0]])) == float("inf")
    assert _relative_gap(torch.tensor([[1.0, 5.0]]), torch.tensor([[1.0, float("nan")]])) == (
        float("inf")
    )
    p = {"w": torch.ones(2, 2, requires_grad=True)}
    assert verify(lambda: a * 2, lambda: a, p) is not None


def test_a_replaced_holder_of_stacked_tensors_is_followed():
    net = nn.Sequential(nn.Linear(3, 2))
    a, b = BatchModule(net, 2, seed=1), BatchModule(net, 2, seed=2)
    x = torch.randn(2, 4, 3)
    a(x)  # the holders are found on first use
    a.stack = b.stack
    torch.testing.assert_close(a(x), b(x))


def test_under_autocast_stacked_computes_as_vmap_does():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    bm = BatchModule(net, 3, strategy="stacked", shared_input=True)
    twin = _vmap_twin(bm)
    x = torch.randn(5, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = bm(x), twin(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


def test_a_changed_forward_is_another_decision_key():
    """The disk cache outlives code edits: the same class name and tensors with another
    forward must not read the old decision."""

    def build(double: bool):
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(3, 2)

            if double:

                def forward(self, x):
                    return self.fc(x) * 2

            else:

                def forward(self, x):
                    return self.fc(x)

        return Net()

    x = torch.randn(2, 4, 3)
    one, two, again = (BatchModule(build(d), 2) for d in (False, True, False))
    params = one._tensors()[0]
    assert one._key(params, (x,)) != two._key(params, (x,))
    assert one._key(params, (x,)) == again._key(params, (x,))
