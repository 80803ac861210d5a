"""The torch compile ladder: verified, never frozen, transparent to the module's users.

Most tests use the cheap rungs (CHANNELS_LAST, ONNXRUNTIME, PYTORCH): what is tested is
the ladder, not inductor. ``min_speedup=1e-9`` makes any verified candidate win, so the
laws run under the candidate, not under eager by default.
"""

from __future__ import annotations

import copy
import io
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn
from torch.overrides import TorchFunctionMode

import dualtrain_torch
from dualtrain.errors import ArgumentError
from dualtrain_torch import accelerate, accelerate_model
from dualtrain_torch.compilation import AcceleratedForward, explain
from dualtrain_torch.compilation.rungs import onnx_available
from tests.accelerate.test_accelerate_ladder import Ticks
from tests.accelerate.torch import compilation_models as models
from tests.accelerate.torch.compilation_models import FORCE
from tests.helpers import CHILD_TIMEOUT_S

CHEAP = ["CHANNELS_LAST", "ONNXRUNTIME", "PYTORCH"]
# no compile budget: a verdict must not turn on how busy the machine is


def batch(seed: int, n: int = 6, shape: tuple[int, ...] = (3, 8, 8)) -> torch.Tensor:
    return torch.randn((n, *shape), generator=torch.Generator().manual_seed(seed))


def chosen(module: nn.Module, mode: str) -> str | None:
    return explain(module).chosen(mode)


def train_steps(model, opt, xs, ys, seeds):
    losses = []
    for x, y, s in zip(xs, ys, seeds, strict=True):
        torch.manual_seed(s)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@settings(max_examples=8)
@given(
    kind=st.sampled_from(["mlp", "cnn"]),
    optimizer=st.sampled_from(["sgd", "adam"]),
    steps=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_k_training_steps_under_the_chosen_rung_equal_eager_training(kind, optimizer, steps, seed):
    build = models.mlp if kind == "mlp" else models.cnn
    shape = (12,) if kind == "mlp" else (3, 8, 8)
    eager, fast = build(seed), build(seed)
    accelerate(fast, CHEAP, **FORCE)

    def make(m):
        if optimizer == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        return torch.optim.Adam(m.parameters(), lr=1e-2)

    xs = [batch(seed + i, 8, shape) for i in range(steps)]
    ys = [
        torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(i)) for i in range(steps)
    ]
    seeds = [seed + 100 + i for i in range(steps)]
    want = train_steps(eager, make(eager), xs, ys, seeds)
    got = train_steps(fast, make(fast), xs, ys, seeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(eager.state_dict().items(), fast.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    if kind == "cnn":
        assert chosen(fast, "train") == "CHANNELS_LAST"  # the law ran under the candidate
    eager.eval(), fast.eval()
    with torch.no_grad():
        torch.testing.assert_close(fast(xs[0]), eager(xs[0]), rtol=1e-4, atol=1e-5)


def test_train_and_eval_are_decided_apart_and_never_frozen():
    eager, fast = models.cnn(3, dropout=0.5), models.cnn(3, dropout=0.5)
    accelerate(fast, CHEAP, **FORCE)
    x = batch(1)
    for mode in ["eval", "train", "eval", "train", "train", "eval"]:
        for m in (eager, fast):
            m.train(mode == "train")
        torch.manual_seed(7)
        with torch.no_grad():
            want = eager(x)
        torch.manual_seed(7)
        with torch.no_grad():
            got = fast(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for a, b in zip(eager.buffers(), fast.buffers(), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    modes = {d.mode for d in explain(fast).decisions}
    assert modes == {"train", "eval"}
    fast.train()
    with torch.no_grad():
        torch.manual_seed(1)
        a = fast(x)
        torch.manual_seed(2)
        b = fast(x)
    assert not torch.equal(a, b), "dropout is on in training"


def test_a_wrong_candidate_is_never_chosen():
    model = models.StridedCNN()
    reference = copy.deepcopy(model)
    accelerate(model, ["CHANNELS_LAST", "PYTORCH"], **FORCE)
    x = batch(0)
    torch.testing.assert_close(model(x), reference(x))
    attempt = explain(model).decisions[0].attempts[0]
    assert (attempt.rung, attempt.status) == ("CHANNELS_LAST", "rejected")
    assert "differs from eager" in attempt.reason
    assert chosen(model, "train") == "PYTORCH"
    assert all(p.is_contiguous() for p in model.parameters()), "parameters keep their layout"


def test_a_failing_candidate_is_never_chosen():
    model = models.ViewCNN()
    accelerate(model, ["CHANNELS_LAST", "PYTORCH"], **FORCE)
    model(batch(0))
    attempt = explain(model).decisions[0].attempts[0]
    assert attempt.status == "failed" and "RuntimeError" in attempt.reason
    assert chosen(model, "train") == "PYTORCH"


@pytest.mark.skipif(not onnx_available(), reason="the onnx extra is not installed")
def test_a_data_dependent_branch_is_never_frozen_into_a_graph():
    model = models.BranchyCNN().eval()
    reference = copy.deepcopy(model)
    accelerate(model, ["ONNXRUNTIME", "PYTORCH"], **FORCE)
    x = batch(0)
    with torch.no_grad():
        for sign in (1, -1, 1):
            torch.testing.assert_close(model(sign * x), reference(sign * x))
            torch.testing.assert_close(model(-sign * x - 3), reference(-sign * x - 3))
    attempt = explain(model).decisions[0].attempts[0]
    assert attempt.status == "unavailable" and "data-dependent" in attempt.reason


@pytest.mark.skipif(not onnx_available(), reason="the onnx extra is not installed")
def test_onnx_runtime_follows_the_weights_after_training():
    model, reference = models.cnn(5), models.cnn(5)
    accelerate(model, ["ONNXRUNTIME", "PYTORCH"], **FORCE)
    x = batch(2)
    for m in (model, reference):
        m.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
    assert chosen(model, "eval") == "ONNXRUNTIME"
    for m in (model, reference):
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        torch.manual_seed(0)
        nn.functional.cross_entropy(m(x), torch.zeros(6, dtype=torch.long)).backward()
        opt.step()
        m.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
        model.load_state_dict(models.cnn(9).state_dict())
        torch.testing.assert_close(model(x), models.cnn(9).eval()(x), rtol=1e-4, atol=1e-5)
    # With gradients on, ONNX Runtime (which computes none) is not used.
    accelerate(model, ["ONNXRUNTIME", "PYTORCH"], **FORCE)
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_new_signature_is_reverified_and_max_signatures_holds():
    model = models.cnn(1)
    accelerate(model, CHEAP, max_signatures=2, **FORCE)
    model.eval()
    with torch.no_grad():
        for n in (6, 5, 4):
            model(batch(n, n))
    decisions = explain(model).decisions
    assert [d.signature.split(")")[0][9:11] for d in decisions] == ["6,", "5,", "4,"]
    assert "re-verified" in decisions[1].attempts[0].reason
    assert decisions[2].chosen == "PYTORCH" and "more than 2" in decisions[2].attempts[0].reason


def test_a_second_run_reads_the_decision_from_the_cache(tmp_path):
    x = batch(0)
    first = accelerate(
        models.cnn(0), CHEAP, cache=tmp_path, min_speedup=1e-9, warm_steps=1, budget=math.inf
    )
    first(x)
    second = accelerate(
        models.cnn(0),
        CHEAP,
        cache=tmp_path,
        min_speedup=1e-9,
        warm_steps=1,
        clock=Ticks(),
        budget=math.inf,
    )
    reference = models.cnn(0)
    torch.manual_seed(0)
    out = second(x)
    decision = explain(second).decisions[0]
    assert decision.from_cache
    assert decision.decide_s == 1.0  # the clock read at the start and the end, nothing timed
    assert decision.chosen == explain(first).decisions[0].chosen
    torch.manual_seed(0)
    torch.testing.assert_close(out, reference(x))
    # Another structure is another key.
    third = accelerate(
        models.cnn(0, dropout=0.3), CHEAP, cache=tmp_path, warm_steps=1, budget=math.inf
    )
    third(x)
    assert not explain(third).decisions[0].from_cache


def test_a_corrupted_cache_file_is_ignored(tmp_path):
    model = accelerate(models.cnn(0), CHEAP, **{**FORCE, "cache": tmp_path})
    model(batch(0))
    for path in tmp_path.glob("*.json"):
        path.write_text("{ not json")
    again = accelerate(
        models.cnn(0), CHEAP, cache=tmp_path, min_speedup=1e-9, warm_steps=1, budget=math.inf
    )
    again(batch(0))
    assert not explain(again).decisions[0].from_cache


def test_a_run_time_failure_falls_back_once_and_for_good():
    model = models.SometimesViewCNN()
    reference = copy.deepcopy(model)
    accelerate(model, ["CHANNELS_LAST", "PYTORCH"], **FORCE)
    x = batch(0)
    with torch.no_grad():
        model(x)
        assert chosen(model, "train") == "CHANNELS_LAST"
        big = x.clone()
        big[0, 0, 0, 0] = 1000.0
        torch.testing.assert_close(model(big), reference(big))  # eager answered
        torch.testing.assert_close(model(x), reference(x))
    decision = explain(model).decisions[0]
    assert decision.chosen == "PYTORCH"
    assert any("failed at run time" in e for e in decision.events)


def test_the_accelerated_module_keeps_what_users_rely_on():
    model = models.cnn(0)
    keys = list(model.state_dict())
    calls = []
    model.register_forward_hook(lambda m, i, o: calls.append(1))
    model.register_forward_pre_hook(lambda m, i: calls.append(0))
    same = accelerate(model, CHEAP, **FORCE)
    assert same is model and type(model) is nn.Sequential
    assert list(model.state_dict()) == keys
    model(batch(0))
    model(batch(1))
    assert calls == [0, 1, 0, 1], "hooks fire once per call, trials included"
    model._forward_hooks.clear()  # lambdas do not pickle, accelerated or not
    model._forward_pre_hooks.clear()
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert isinstance(clone.forward, AcceleratedForward) and clone.forward.module is clone
        assert list(clone.state_dict()) == keys
        torch.manual_seed(0)
        a = clone.eval()(batch(3))
        torch.manual_seed(0)
        b = model.eval()(batch(3))
        torch.testing.assert_close(a, b)
        model.train()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    model64 = model.to(torch.float64)
    out = model64(batch(0).double())
    assert out.dtype == torch.float64


def test_ddp_wraps_an_accelerated_module(tmp_path):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this worker")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1
    )
    try:
        model, reference = models.cnn(0), models.cnn(0)
        accelerate(model, CHEAP, **FORCE)
        ddp = nn.parallel.DistributedDataParallel(model)
        x, y = batch(0), torch.zeros(6, dtype=torch.long)
        torch.manual_seed(0)
        nn.functional.cross_entropy(ddp(x), y).backward()
        torch.manual_seed(0)
        nn.functional.cross_entropy(reference(x), y).backward()
        for a, b in zip(reference.parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)
    finally:
        dist.destroy_process_group()


def test_class_decorators_accelerate_every_instance():
    net = models.DecoratedNet()
    assert type(net) is models.DecoratedNet and isinstance(net.forward, AcceleratedForward)
    net(batch(0))
    assert chosen(net, "train") in ("CHANNELS_LAST", "PYTORCH")
    wider = models.WiderNet()
    assert isinstance(wider, models.DecoratedNet) and "extra" in dict(wider.named_children())
    out = wider(batch(0))
    assert out.shape == (6, 3)
    bare = models.BareNet()
    assert isinstance(bare.forward, AcceleratedForward)
    clone = pickle.loads(pickle.dumps(net))
    assert type(clone) is models.DecoratedNet
    torch.testing.assert_close(clone.eval()(batch(1)), net.eval()(batch(1)))
    with pytest.warns(DeprecationWarning, match="compat.nebulgym.annotations"):
        assert dualtrain_torch.patch_torch_module is accelerate_model  # moved to compat
    instance = accelerate_model(backends=["PYTORCH"])(nn.Linear(2, 2))
    assert isinstance(instance.forward, AcceleratedForward)


def test_patch_backprop_is_named_in_the_report():
    model = models.mlp(0)
    accelerate(model, ["PYTORCH"], patch_backprop=True, **FORCE)
    model(torch.randn(4, 12)).sum().backward()
    report = explain(model)
    assert any("approximate" in line for line in report.approximations)
    assert "approximate (patch_backprop)" in str(report)
    exact = accelerate(models.mlp(0), ["PYTORCH"], **FORCE)
    exact(torch.randn(4, 12))
    assert "exact: no approximation" in str(explain(exact))
    # Patched before it was accelerated: still approximate, and said so.
    from dualtrain_torch.sparse_backprop import patch_linears

    before = models.mlp(0)
    patch_linears(before, k=2)
    accelerate(before, ["PYTORCH"], **FORCE)
    before(torch.randn(4, 12))
    assert any("top-2 of 32" in line for line in explain(before).approximations)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"backends": ["TURBO"]}, "backends"),
        ({"backends": []}, "backends"),
        ({"backends": 3}, "backends"),
        ({"patch_backprop": "yes"}, "patch_backprop"),
        ({"patch_backprop": {"K": 16}}, "patch_backprop"),
        ({"patch_backprop": {"k": 0}}, "patch_backprop"),
        ({"patch_backprop": {"k": 2, "ratio": 0.5}}, "patch_backprop"),
        ({"warm_steps": 0}, "warm_steps"),
        ({"compile_budget": -1}, "compile_budget"),
        ({"turbo": True}, "options"),
    ],
)
def test_bad_arguments_name_themselves_and_change_nothing(kwargs, name):
    model = models.mlp(0)
    with pytest.raises(ArgumentError, match=name):
        accelerate(model, **kwargs)
    assert "forward" not in model.__dict__
    with pytest.raises(ArgumentError, match="module"):
        accelerate(lambda x: x)
    with pytest.raises(ArgumentError, match="accelerate"):
        explain(models.mlp(0))


def test_nebulgym_backend_names_and_enum_members_are_accepted():
    import enum

    class NebulgymBackend(enum.Enum):
        PYTORCH = "PYTORCH"
        RAMMER = "RAMMER"
        ONNXRUNTIME = "ONNXRUNTIME"

    model = accelerate(models.mlp(0), [NebulgymBackend.RAMMER, "torchscript"], **FORCE)
    model(torch.randn(4, 12))
    statuses = {a.rung: a.status for a in explain(model).decisions[0].attempts}
    assert statuses == {"RAMMER": "unavailable", "TORCHSCRIPT": "unavailable", "PYTORCH": "chosen"}


@pytest.mark.slow
def test_torch_compile_is_verified_and_timed(tmp_path):
    """The real compiler once: inductor on a small MLP, in eval and in training."""
    model, reference = models.mlp(0), models.mlp(0)
    accelerate(model, ["TORCH_COMPILE", "PYTORCH"], **{**FORCE, "cache": tmp_path, "warm_steps": 2})
    x = torch.randn(16, 12)
    torch.manual_seed(0)
    out = model(x)
    torch.manual_seed(0)
    torch.testing.assert_close(out, reference(x), rtol=1e-4, atol=1e-5)
    attempt = explain(model).decisions[0].attempts[0]
    assert attempt.rung == "TORCH_COMPILE" and attempt.status in ("chosen", "failed"), attempt
    if attempt.status == "chosen":
        assert attempt.compile_s and attempt.compile_s > 0 and attempt.speedup


needs_onnx = pytest.mark.skipif(not onnx_available(), reason="the onnx extra is not installed")


@needs_onnx
def test_submodule_modes_are_kept_and_decided_apart():
    """Monte Carlo dropout: the root in eval, its dropout in training. No rung may switch
    the dropout off, and switching it on after a decision is a new decision."""
    x = batch(0)
    for switch_after in (False, True):
        model, reference = models.cnn(2, dropout=0.5), models.cnn(2, dropout=0.5)
        accelerate(model, ["ONNXRUNTIME", "PYTORCH"], **FORCE)
        for m in (model, reference):
            m.eval()
            m[5].train(not switch_after)
        with torch.no_grad():
            model(x)
            if switch_after:
                assert chosen(model, "eval") == "ONNXRUNTIME"
                model[5].train(), reference[5].train()
            torch.manual_seed(4)
            got = model(x)
            torch.manual_seed(4)
            want = reference(x)
        torch.testing.assert_close(got, want)
        assert [m.training for m in model.modules()] == [m.training for m in reference.modules()]
        last = explain(model).decisions[-1]
        assert last.chosen == "PYTORCH" and "[train: 5]" in last.signature


@needs_onnx
def test_a_forward_that_writes_into_its_inputs_writes_once_and_is_compared():
    model, reference = models.ScalesItsInput(), models.ScalesItsInput()
    accelerate(model, ["CHANNELS_LAST", "ONNXRUNTIME", "PYTORCH"], **FORCE)
    for mode in ("train", "eval"):
        for m in (model, reference):
            m.train(mode == "train")
        x, y = batch(1), batch(1)
        with torch.set_grad_enabled(mode == "train"):
            torch.testing.assert_close(model(x), reference(y))
        torch.testing.assert_close(x, y, msg="the user's input is written once, by the call")
    attempts = {a.rung: a for a in explain(model).decisions[-1].attempts}
    # ONNX Runtime computes the same outputs but leaves the input as it was: rejected.
    assert attempts["ONNXRUNTIME"].status == "rejected"
    assert "input[0]" in attempts["ONNXRUNTIME"].reason


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), calls=st.integers(1, 3))
def test_trials_leave_every_generator_as_eager_would_find_it(seed, calls):
    """The calls after a decision draw what eager draws: torch's generator, the model's own
    generators, and builds that ran the forward and then gave up (the ONNX export)."""
    backends = ["CHANNELS_LAST", "ONNXRUNTIME", "PYTORCH"]
    x = batch(seed)
    for build, mode in ((models.OwnNoise, "train"), (models.NoisyBranch, "eval")):
        model, reference = build(), build()
        accelerate(model, backends, **FORCE)
        model.train(mode == "train"), reference.train(mode == "train")
        with torch.no_grad():
            torch.manual_seed(seed)
            got = [model(x) for _ in range(calls)]
            torch.manual_seed(seed)
            want = [reference(x) for _ in range(calls)]
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)


@needs_onnx
def test_onnx_runtime_follows_attributes_and_hooks_and_gives_up_on_churn():
    model, reference = models.Tempered().eval(), models.Tempered().eval()
    accelerate(model, ["ONNXRUNTIME", "PYTORCH"], **FORCE)
    x = batch(3)

    def same(times: int = 2) -> None:
        with torch.no_grad():
            for _ in range(times):
                torch.testing.assert_close(model(x), reference(x))

    same()
    assert chosen(model, "eval") == "ONNXRUNTIME"
    model.temperature = reference.temperature = 0.5
    same()
    model.mask[0].zero_(), reference.mask[0].zero_()
    same()
    for m in (model, reference):
        m.conv.register_forward_hook(lambda mod, i, out: out + 1.0)
    same()
    assert chosen(model, "eval") == "ONNXRUNTIME", "the session was re-exported each time"
    for t in (0.25, 2.0, 4.0):  # a change before every call: exporting each time is slower
        model.temperature = reference.temperature = t
        same(1)
    assert chosen(model, "eval") == "PYTORCH"
    assert "changed on two calls in a row" in explain(model).decisions[0].events[0]


@needs_onnx
def test_trials_leave_plain_attributes_as_they_found_them():
    """A forward that counts its calls: the trials ran it a dozen times, the user once."""
    model, reference = models.CountsCalls(), models.CountsCalls()
    accelerate(model, CHEAP, **FORCE)
    x = batch(4)
    for mode in ("train", "eval"):
        for m in (model, reference):
            m.train(mode == "train")
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(model(x), reference(x))
        assert model.calls == reference.calls
        assert model.log == reference.log and model.tally == reference.tally
    attempts = {a.rung: a for a in explain(model).decisions[-1].attempts}
    assert attempts["ONNXRUNTIME"].status == "unavailable"
    assert "changes the model's attributes" in attempts["ONNXRUNTIME"].reason


def test_a_trial_never_runs_backward_through_the_users_graph():
    """The weight of an output layer shared with an embedding outside the module: the
    trials' backward must not free the embedding's part of the user's graph."""
    torch.manual_seed(0)
    embedding = nn.Embedding(10, 6)
    head = accelerate(models.TiedHead(embedding.weight), CHEAP, **FORCE)
    tokens = torch.tensor([[1, 2, 3]])
    head(embedding(tokens)).sum().backward()
    want = embedding.weight.grad.clone()
    embedding.weight.grad = None
    models.TiedHead(embedding.weight)(embedding(tokens)).sum().backward()
    torch.testing.assert_close(want, embedding.weight.grad)


def test_other_tracers_and_transforms_see_the_plain_forward():
    """jit.trace, onnx.export, fx, vmap and grad record the forward: no trial, snapshot or
    session may run inside them (a decision inside jit.trace crashed the process)."""
    import warnings

    child = accelerate(models.cnn(0), CHEAP, **FORCE).eval()
    parent = nn.Sequential(child, nn.ReLU()).eval()
    reference = nn.Sequential(models.cnn(0), nn.ReLU()).eval()
    x = batch(5)
    with torch.no_grad():
        want = reference(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporters' deprecation notices
            traced = torch.jit.trace(parent, x, check_trace=False)  # the check is a real call
            torch.onnx.export(parent, (x,), io.BytesIO(), dynamo=False)
        graph = torch.fx.symbolic_trace(nn.Sequential(nn.Identity(), parent))
        mapped = torch.vmap(parent)(x.unsqueeze(1)).squeeze(1)
    gradient = torch.func.grad(lambda v: parent(v).sum())(x)
    assert explain(child).decisions == [], "nothing was decided inside a tracer"
    torch.testing.assert_close(traced(x), want)
    torch.testing.assert_close(graph(x), want)
    torch.testing.assert_close(mapped, want)
    torch.testing.assert_close(gradient, torch.func.grad(lambda v: reference(v).sum())(x))


@pytest.mark.slow
def test_a_second_process_reads_the_decision_from_the_cache(tmp_path):
    """The key must not depend on the process: str hashes are seeded per process."""
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from dualtrain_torch import accelerate\n"
        "from dualtrain_torch.compilation import explain\n"
        "from tests.accelerate.torch import compilation_models as models\n"
        f"model = accelerate(models.cnn(0), {CHEAP!r}, cache={str(tmp_path)!r}, warm_steps=1,"
        " budget=float('inf'))\n"
        "model(torch.randn(6, 3, 8, 8))\n"
        "print(explain(model).decisions[0].from_cache)\n"
    )
    seen = []
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": seed},
            cwd=__import__("pathlib").Path(__file__).parents[3],
            timeout=CHILD_TIMEOUT_S,
        )
        seen.append(done.stdout.split()[-1])
    assert seen == ["False", "True"]


def test_an_edited_forward_is_decided_again_not_read_from_the_cache(tmp_path):
    options = {"cache": tmp_path, "min_speedup": 1e-9, "warm_steps": 1, "budget": math.inf}
    x = batch(6)
    first = accelerate(models.FlatHead(), ["CHANNELS_LAST", "PYTORCH"], **options)
    first(x)
    assert chosen(first, "train") == "CHANNELS_LAST"
    edited = models.EditedFlatHead()
    assert (type(edited).__qualname__, repr(edited)) == ("FlatHead", repr(first))
    want = copy.deepcopy(edited)(x)
    accelerate(edited, ["CHANNELS_LAST", "PYTORCH"], **options)
    torch.testing.assert_close(edited(x), want)
    decision = explain(edited).decisions[0]
    assert not decision.from_cache and decision.chosen == "PYTORCH"


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), calls=st.integers(1, 3))
def test_buffers_a_forward_reassigns_move_once_per_call(seed, calls):
    model, reference = models.ReassignsBuffers(), models.ReassignsBuffers()
    accelerate(model, CHEAP, **FORCE)
    x = batch(seed)
    for _ in range(calls):
        torch.testing.assert_close(model(x), reference(x))
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(model.get_buffer(name), buffer, msg=name)
    assert chosen(model, "train") == "CHANNELS_LAST"


class OpsClock(TorchFunctionMode):
    """A clock whose seconds are the torch operations run so far: a rung's cost, counted
    the same on a busy machine as on an idle one."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))

    def __call__(self) -> float:
        return float(self.ops)


OPS = {"warm_steps": 1, "cache": False, "compile_budget": 1e9, "budget": math.inf}  # in operations


def test_a_rung_is_timed_with_what_a_real_call_under_it_costs():
    """Per call, a candidate also pays the snapshot that lets it fall back (here 2000
    buffer copies around a forward of one multiply); the trial's own restoring is not a
    cost of either. Time is counted in torch operations (`OpsClock`)."""
    clock = OpsClock()
    model = accelerate(
        models.ManyBuffers(),
        ["CHANNELS_LAST", "PYTORCH"],
        min_speedup=0.2,
        **OPS,
        clock=clock,
    )
    with torch.no_grad(), clock:
        model(batch(0, 2, (3, 4, 4)))
    candidate, eager = explain(model).decisions[0].attempts
    assert candidate.status == "rejected" and candidate.speedup < 0.2, candidate
    # eager's step is its forward alone; the candidate's, the forward and 2000 copies
    assert eager.step_ms < 10e3 <= 2000e3 <= candidate.step_ms, (eager, candidate)
    # without the snapshot (evaluation moves no buffer), the same rung costs as eager does
    clock, plain = OpsClock(), models.ManyBuffers().eval()
    accelerate(plain, ["CHANNELS_LAST", "PYTORCH"], **OPS, clock=clock)
    with torch.no_grad(), clock:
        plain(batch(0, 2, (3, 4, 4)))
    candidate, eager = explain(plain).decisions[0].attempts
    assert candidate.step_ms < 10e3, candidate


def test_the_ladder_times_on_the_clock_it_is_given():
    """Under a clock that moves one second per reading, every step costs one second:
    CHANNELS_LAST is verified but not faster, whatever the machine is doing."""
    model = accelerate(
        models.cnn(0),
        ["CHANNELS_LAST", "PYTORCH"],
        warm_steps=3,
        cache=False,
        clock=Ticks(),
        budget=math.inf,
    )
    model(batch(0))
    candidate, eager = explain(model).decisions[0].attempts
    assert chosen(model, "train") == "PYTORCH"
    assert candidate.status == "rejected"
    assert candidate.reason == "verified, but not 1.03x faster than eager"
    # two readings: the build and the first run are timed apart, around eager's check
    assert (candidate.compile_s, candidate.step_ms, candidate.speedup) == (2.0, 1e3, 1.0)
    assert eager.step_ms == 1e3


@needs_onnx
def test_autocast_is_part_of_the_signature():
    model = accelerate(models.cnn(1), ["ONNXRUNTIME", "PYTORCH"], **FORCE).eval()
    reference = models.cnn(1).eval()
    x = batch(7)
    with torch.no_grad():
        model(x)
        assert chosen(model, "eval") == "ONNXRUNTIME"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = model(x), reference(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
    last = explain(model).decisions[-1]
    assert "autocast[cpu:bfloat16]" in last.signature and last.chosen != "ONNXRUNTIME"


def test_accelerating_again_reports_and_applies_the_latest_backprop_settings():
    from dualtrain_torch.sparse_backprop import TopKLinear

    x = torch.randn(4, 12)
    model = accelerate(models.mlp(0), ["PYTORCH"], **FORCE)
    model(x)
    accelerate(model, ["PYTORCH"], patch_backprop=True)
    model(x)
    assert any(type(m) is TopKLinear for m in model.modules())
    assert explain(model).approximations, "what is approximate is reported"
    accelerate(model, ["PYTORCH"], patch_backprop=False)
    model(x)
    assert not any(type(m) is TopKLinear for m in model.modules())
    assert not explain(model).approximations
    accelerate(model, ["PYTORCH"], patch_backprop={"k": 2}, **FORCE)
    model(x)
    assert {m.topk_k for m in model.modules() if type(m) is TopKLinear} == {2}
    assert len(explain(model).approximations) == 2


def test_a_run_time_fallback_leaves_no_trace_of_the_failed_rung():
    model, reference = models.CountsThenSometimesViews(), models.CountsThenSometimesViews()
    accelerate(model, ["CHANNELS_LAST", "PYTORCH"], **FORCE)
    x = batch(0)
    big = x.clone()
    big[0, 0, 0, 0] = 1000.0
    with torch.no_grad():
        for inputs in (x, big, x):
            torch.testing.assert_close(model(inputs), reference(inputs))
    assert model.calls == reference.calls == 3
    assert any("failed at run time" in e for e in explain(model).decisions[0].events)


def test_fresh_inputs_copy_each_tensor_once_and_cut_the_graph():
    from dualtrain_torch.compilation.probe import fresh_inputs

    leaf = torch.randn(3, requires_grad=True)
    computed = leaf * 2
    args, kwargs = fresh_inputs((computed, computed, 1), {"same": computed, "n": None})
    assert args[0] is args[1] is kwargs["same"], "one tensor passed twice stays one"
    assert args[0].requires_grad and not args[0].is_leaf and args[0].grad_fn is not None
    args[0].mul_(3)  # writes into the copy, as a forward may
    torch.testing.assert_close(computed, leaf * 2)
    (grad,) = torch.autograd.grad(args[0].sum(), [args[0]])
    assert leaf.grad is None and grad.shape == (3,)
    assert args[2] == 1 and kwargs["n"] is None


@needs_onnx
def test_parameters_unfrozen_after_the_choice_get_their_gradients():
    """Eval mode with gradients on and a frozen model (linear probing) picks ONNX Runtime;
    unfreezing it later must give gradients, not a session's constant outputs."""
    model = accelerate(models.cnn(0), ["ONNXRUNTIME", "PYTORCH"], **FORCE).eval()
    model.requires_grad_(False)
    x = batch(8)
    model(x)
    assert chosen(model, "eval") == "ONNXRUNTIME"
    model.requires_grad_(True)
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert "gradients are needed now" in explain(model).decisions[0].events[0]


def test_the_quick_keys_fast_reads_agree_with_torchs_public_checks(monkeypatch):
    """The quick key reads ONNX's export flags and autocast's any-device flag directly (a
    tenth of the public calls' cost): each reading must say what the public call says."""
    from dualtrain_torch.compilation import module as cm

    assert cm._onnx_exporting() is torch.onnx.is_in_onnx_export() is False
    try:
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
    except ImportError:
        pytest.skip("this torch keeps ONNX's export flag elsewhere: the public call is used")
    from torch.onnx._internal.exporter import _flags

    monkeypatch.setattr(GLOBALS, "in_onnx_export", True)  # the TorchScript exporter's flag
    assert cm._onnx_exporting() is torch.onnx.is_in_onnx_export() is True
    monkeypatch.setattr(GLOBALS, "in_onnx_export", False)
    monkeypatch.setattr(_flags, "_is_onnx_exporting", True)  # the dynamo exporter's
    assert cm._onnx_exporting() is torch.onnx.is_in_onnx_export() is True
    x = torch.randn(4, 12)
    assert accelerate(models.mlp(0), ["PYTORCH"], **FORCE).forward._quick_key((x,), {}) is None
    monkeypatch.setattr(_flags, "_is_onnx_exporting", False)
    assert not cm._any_autocast()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cm._any_autocast()
    # A quick key under autocast differs from one without (a new decision, not a stale one).
    model = accelerate(models.mlp(0), ["PYTORCH"], **FORCE).eval()
    plain = model.forward._quick_key((x,), {})
    assert plain is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.forward._quick_key((x,), {}) != plain


# A call as the lane sees it: (rows, dtype, requires_grad, grad mode, root in training,
# dropout in training, transposed input, autocast).
_lane_calls = st.tuples(
    st.sampled_from([3, 4]),
    st.sampled_from([torch.float32, torch.float64]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=30, deadline=None)
@given(calls=st.lists(_lane_calls, min_size=1, max_size=12))
def test_the_eager_lane_serves_only_the_signature_it_checked(calls):
    """Once a signature is eager for good, its calls skip the quick key (dynamo's C++
    tensor check and the modes). Law: whatever sequence of signatures comes, every call
    computes the plain model's output, and every distinct signature is decided apart,
    as the full key tells them apart (none is served under another's decision)."""
    from dualtrain_torch.compilation.keys import modes, signature

    model, reference = models.mlp(0, dropout=0.0), models.mlp(0, dropout=0.0)
    accelerate(model, ["PYTORCH"], **FORCE)
    seen = set()
    for rows, dtype, needs_grad, grad, root, drop, transposed, cast in calls:
        x = torch.randn(12, rows, dtype=dtype).t() if transposed else torch.randn(rows, 12)
        x = x.to(dtype).requires_grad_(needs_grad)
        for m in (model, reference):
            m.to(dtype).train(root)
            m[3].train(drop)
        with torch.set_grad_enabled(grad), torch.autocast("cpu", enabled=cast):
            reference(x)
            want = reference(x)  # twice, as the model: BatchNorm's statistics move alike
            seen.add(("train" if root else "eval", signature((x,), {}) + modes(reference)))
            got = model(x)
            got = model(x)  # the second call of a signature is the lane's
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    decided = {(d.mode, d.signature) for d in explain(model).decisions}
    assert decided == seen


def test_the_eager_lane_is_taken_and_left_for_a_new_signature(monkeypatch):
    from dualtrain_torch.compilation import module as cm

    if cm._tensor_guard is None:
        pytest.skip("this torch has no C++ tensor check: every call takes the quick key")
    model = accelerate(models.mlp(0), ["PYTORCH"], **FORCE).eval()
    x = torch.randn(4, 12)
    with torch.no_grad():
        model(x), model(x)
        keyed = []
        monkeypatch.setattr(
            cm.AcceleratedForward,
            "_quick_key",
            lambda self, args, kwargs: keyed.append(args) or None,
        )
        model(x), model(x.clone())
        assert keyed == []  # the lane served both: same shape, dtype, strides, modes
        model(torch.randn(5, 12))
        assert len(keyed) == 1  # a new shape leaves the lane for the quick key
    model(x)  # gradients on: another signature
    assert len(keyed) == 2
