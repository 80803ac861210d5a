"""Per-member training under torch: member_optimizer equals N separate torch.optim runs."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")

from torch import Tensor, nn  # noqa: E402

from dualtrain.errors import ArgumentError, ShapeError  # noqa: E402
from dualtrain_torch.batching import BatchModule, optim as batching_optim  # noqa: E402
from dualtrain_torch.batching.optim import MemberOptimizer, member_optimizer  # noqa: E402
from tests.batching.member_cases import hyper_cases, member_value  # noqa: E402
from tests.helpers import CHILD_TIMEOUT_S  # noqa: E402

TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
TIGHT = {"rtol": 1e-9, "atol": 1e-12}


def batched(n: int, seed: int = 1) -> BatchModule:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    return BatchModule(net, n, seed=seed, strategy="vmap", check_isolation=False)


def data(n: int, seed: int = 0) -> Tensor:
    return torch.as_tensor(np.random.default_rng(seed).standard_normal((n, 5, 3)))


def backward(bm: BatchModule, x: Tensor) -> None:
    for p in bm.parameters():
        p.grad = None
    bm(x).pow(2).sum().backward()


def reference(name: str, module: nn.Module, keywords: dict, i: int) -> tuple[Any, Any]:
    """torch's own optimizer for member i, and its clipping norm (or None)."""
    own = {k: member_value(v, i) for k, v in keywords.items() if k != "max_grad_norm"}
    clip = keywords.get("max_grad_norm")
    return TORCH[name](module.parameters(), **own), None if clip is None else clip[i]


def step_reference(module: nn.Module, opt: Any, clip: Any, x: Tensor) -> Tensor | None:
    opt.zero_grad()
    module(x).pow(2).sum().backward()
    norm = None
    if clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
    opt.step()
    return norm


@settings(max_examples=25)
@given(case=hyper_cases(), steps=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_members_step_as_separate_torch_optimizers(case, steps, seed):
    name, n, keywords = case
    bm = batched(n, seed)
    opt = member_optimizer(bm, name, n, **keywords)
    models = [bm.extract(i) for i in range(n)]
    refs = [reference(name, m, keywords, i) for i, m in enumerate(models)]
    x = data(n, seed % 7)
    for _ in range(steps):
        backward(bm, x)
        opt.step()
        norms = [
            step_reference(m, o, c, x[i])
            for i, (m, (o, c)) in enumerate(zip(models, refs, strict=True))
        ]
        if keywords["max_grad_norm"] is not None:  # the norm before clipping, per member
            np.testing.assert_allclose(opt.last_grad_norm, torch.stack(norms), **TIGHT)
    stacked = dict(bm.stack.named_parameters())
    for i, model in enumerate(models):
        for key, value in model.named_parameters():
            np.testing.assert_allclose(stacked[key][i].detach(), value.detach(), **TIGHT)
            mine, theirs = opt.state[stacked[key]], refs[i][0].state[value]
            for slot in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
                if theirs.get(slot) is not None:
                    np.testing.assert_allclose(mine[slot][i], theirs[slot], **TIGHT)
            if "step" in theirs:
                assert float(mine["step"][i]) == float(theirs["step"]) == steps


def snapshot(bm: BatchModule, opt: MemberOptimizer) -> dict:
    out = {f"p.{k}": v.detach().clone() for k, v in bm.named_parameters()}
    for j, p in enumerate(bm.parameters()):
        for slot, value in opt.state[p].items():
            out[f"s{j}.{slot}"] = value.clone()
    return out


@settings(max_examples=15)
@given(case=hyper_cases(max_batch=4), mask=st.lists(st.booleans(), min_size=4, max_size=4))
def test_inactive_members_stay_bit_identical_while_others_move(case, mask):
    name, n, keywords = case
    keywords = {**keywords, "lr": 0.1}  # every active member moves
    bm = batched(n)
    opt = member_optimizer(bm, name, n, **keywords)
    x = data(n)
    backward(bm, x)
    opt.step()  # every member has state now
    with torch.no_grad():
        bm.stack.get_parameter("0.bias")[0] = -0.0  # signed zeros survive too
    before = snapshot(bm, opt)
    active = np.array(mask[:n])
    opt.set_active(active)
    for _ in range(2):
        backward(bm, x)
        opt.step()
    after = snapshot(bm, opt)
    for key, old in before.items():
        for i in range(n):
            if not active[i]:
                assert torch.equal(after[key][i], old[i]), key
                assert torch.equal(torch.signbit(after[key][i]), torch.signbit(old[i])), key
    for i in np.flatnonzero(active):
        assert not torch.equal(after["p.stack.0.weight"][i], before["p.stack.0.weight"][i])
        assert float(after["s0.step"][i]) == 3.0


@settings(max_examples=10)
@given(case=hyper_cases(max_batch=2), pauses=st.lists(st.booleans(), min_size=4, max_size=4))
def test_a_paused_member_resumes_as_if_those_steps_were_skipped(case, pauses):
    """Per-member step counts: member 0 paused on some steps equals a run without them."""
    name, n, keywords = case
    bm = batched(n)
    opt = member_optimizer(bm, name, n, **keywords)
    model = bm.extract(0)
    ref, clip = reference(name, model, keywords, 0)
    x = data(n)
    for paused in pauses:
        opt.set_active([not paused] + [True] * (n - 1))
        backward(bm, x)
        opt.step()
        if not paused:
            step_reference(model, ref, clip, x[0])
    for key, value in model.named_parameters():
        np.testing.assert_allclose(bm.stack.get_parameter(key)[0].detach(), value.detach(), **TIGHT)


def test_set_hyper_between_steps_equals_changing_torchs_param_group():
    bm = batched(2)
    opt = member_optimizer(bm, "adamw", 2, lr=[0.1, 0.01], weight_decay=0.1, betas=(0.8, 0.99))
    models = [bm.extract(i) for i in range(2)]
    lrs = [[0.1, 0.01], [0.05, 0.2], [0.0, 0.3]]
    refs = [torch.optim.AdamW(m.parameters(), lr=lrs[0][i], weight_decay=0.1, betas=(0.8, 0.99))
            for i, m in enumerate(models)]  # fmt: skip
    x = data(2)
    for lr in lrs:
        opt.set_hyper(lr=lr)
        backward(bm, x)
        opt.step()
        for i, (m, o) in enumerate(zip(models, refs, strict=True)):
            o.param_groups[0]["lr"] = lr[i]
            step_reference(m, o, None, x[i])
    for i, m in enumerate(models):
        for key, value in m.named_parameters():
            np.testing.assert_allclose(bm.stack.get_parameter(key)[i].detach(), value.detach())
    np.testing.assert_array_equal(opt.hyper.lr, [0.0, 0.3])


def test_float32_members_match_torch_at_float32():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    bm = BatchModule(net, 3, seed=2, strategy="vmap", check_isolation=False)
    lrs, betas = [0.1, 0.01, 0.001], ([0.9, 0.5, 0.0], 0.99)
    opt = member_optimizer(bm, "adam", 3, lr=lrs, betas=betas, weight_decay=0.1)
    models = [bm.extract(i) for i in range(3)]
    refs = [
        torch.optim.Adam(m.parameters(), lr=lr, betas=(b1, 0.99), weight_decay=0.1)
        for m, lr, b1 in zip(models, lrs, betas[0], strict=True)
    ]
    x = data(3).float()
    for _ in range(3):
        backward(bm, x)
        opt.step()
        for i, (m, o) in enumerate(zip(models, refs, strict=True)):
            step_reference(m, o, None, x[i])
    for i, m in enumerate(models):
        for key, value in m.named_parameters():
            assert bm.stack.get_parameter(key).dtype == torch.float32
            np.testing.assert_allclose(
                bm.stack.get_parameter(key)[i].detach(), value.detach(), rtol=1e-5, atol=1e-6
            )


@pytest.mark.parametrize(
    "schedule",
    [
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda epoch: 1.0 / (1 + epoch)),
    ],
    ids=["StepLR", "CosineAnnealingLR", "LambdaLR"],
)
def test_torch_lr_schedulers_scale_every_members_rate(schedule):
    """A scheduler scales the group's factor ``lr`` (1.0): member i follows its own
    optimizer under the same scheduler."""
    bm = batched(2)
    opt = member_optimizer(bm, "adamw", 2, lr=[0.1, 0.02], weight_decay=[0.1, 0.0])
    scheduler = schedule(opt)
    models = [bm.extract(i) for i in range(2)]
    refs = [
        torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd)
        for m, lr, wd in zip(models, [0.1, 0.02], [0.1, 0.0], strict=True)
    ]
    ref_schedulers = [schedule(o) for o in refs]
    x = data(2)
    for _ in range(4):
        backward(bm, x)
        opt.step()
        scheduler.step()
        for i, (m, o, s) in enumerate(zip(models, refs, ref_schedulers, strict=True)):
            step_reference(m, o, None, x[i])
            s.step()
    for i, m in enumerate(models):
        for key, value in m.named_parameters():
            np.testing.assert_allclose(
                bm.stack.get_parameter(key)[i].detach(), value.detach(), **TIGHT
            )
    np.testing.assert_array_equal(opt.hyper.lr, [0.1, 0.02])  # the members' own rates


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_state_dict_round_trips(name):
    extra = {"momentum": [0.5, 0.9]} if name == "sgd" else {"betas": ([0.8, 0.9], 0.99)}
    runs = []
    for _ in range(2):
        bm = batched(2)
        opt = member_optimizer(bm, name, 2, lr=[0.1, 0.05], max_grad_norm=[0.5, math.inf], **extra)
        runs.append((bm, opt))
    (bm, opt), (copy, fresh) = runs
    x = data(2)
    for _ in range(2):
        backward(bm, x)
        opt.step()
    opt.set_hyper(lr=[0.3, 0.0], active=[False, True])
    buffer = io.BytesIO()
    torch.save({"model": bm.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    copy.load_state_dict(saved["model"])
    fresh.load_state_dict(saved["opt"])
    np.testing.assert_array_equal(fresh.hyper.lr, [0.3, 0.0])
    np.testing.assert_array_equal(fresh.hyper.active, [False, True])
    for model, o in ((bm, opt), (copy, fresh)):
        backward(model, x)
        o.step()
    assert all(
        torch.equal(a, b)
        for a, b in zip(snapshot(bm, opt).values(), snapshot(copy, fresh).values(), strict=True)
    )
    other = member_optimizer(batched(2), "sgd" if name != "sgd" else "adam", 2, lr=0.1)
    with pytest.raises(ArgumentError, match="state_dict's name"):
        other.load_state_dict(opt.state_dict())


@pytest.mark.parametrize(
    ("keywords", "match"),
    [
        ({"name": "lamb"}, r"name must be one of \('sgd', 'adam', 'adamw'\)"),
        ({"lr": [0.1, 0.2, 0.3]}, r"lr must be a number or 2 numbers .*shape \(2,\)"),
        ({"lr": -0.1}, "lr must be a number or 2 numbers"),
        ({"lr": [0.1, math.nan]}, "lr must be"),
        ({"lr": True}, "lr must be"),
        ({"lr": "0.1"}, "lr must be"),
        ({"weight_decay": math.inf}, "weight_decay must be"),
        ({"name": "adam", "betas": (0.9, 1.0)}, r"betas\[1\] must be .*in \[0, 1\)"),
        ({"name": "adam", "betas": 0.9}, "betas must be a pair"),
        ({"name": "adam", "momentum": 0.9}, "momentum must be its default 0.0 for 'adam'"),
        ({"name": "sgd", "betas": (0.5, 0.9)}, "betas must be its default"),
        ({"name": "sgd", "nesterov": True, "momentum": [0.9, 0.0]}, "momentum must be > 0"),
        ({"max_grad_norm": [1.0]}, "max_grad_norm must be"),
        ({"active": [1, 0]}, "active must be None or 2 bools"),
        ({"batch": 0}, "batch must be a positive int"),
    ],
)
def test_bad_arguments_are_refused(keywords, match):
    bm = batched(2)
    arguments = {"name": "sgd", "batch": 2, "lr": 0.1} | keywords
    with pytest.raises(ArgumentError, match=match):
        member_optimizer(bm, **arguments)


def test_bad_parameters_and_changes_are_refused():
    bm = batched(2)
    with pytest.raises(ShapeError, match=r"params\[0\] must have the member count"):
        member_optimizer(bm, "sgd", 3, lr=0.1)
    with pytest.raises(ArgumentError, match="params must be a BatchModule"):
        member_optimizer(torch.zeros(2, 3), "sgd", 2, lr=0.1)
    opt = member_optimizer(bm, "sgd", 2, lr=0.1)
    before = opt.hyper
    with pytest.raises(ArgumentError, match="set_hyper keyword must be one of"):
        opt.set_hyper(betas=(0.9, 0.99))
    with pytest.raises(ArgumentError, match="max_grad_norm must be unchanged"):
        opt.set_hyper(max_grad_norm=1.0)
    with pytest.raises(ArgumentError, match="lr must be"):
        opt.set_hyper(weight_decay=0.1, lr=[0.1, -1.0])
    np.testing.assert_array_equal(opt.hyper.weight_decay, before.weight_decay)  # nothing moved


# -- the vectorized step: every path against torch.optim, member by member -----------------

MEMBER_SHAPES = ((3, 5), (5,), (2, 3), ())  # each parameter's shape for one member
CLOSE = {torch.float64: TIGHT, torch.float32: {"rtol": 1e-5, "atol": 1e-6}}
SLOTS = ("exp_avg", "exp_avg_sq", "momentum_buffer")


@dataclasses.dataclass
class Turn:
    """One step of a schedule: who is active, and what changes just before the step."""

    active: list[bool]
    change: dict  # set_hyper keywords ({} for none)
    factor: float | None  # a new group "lr" (what an LR scheduler writes)
    reload: bool  # state_dict -> torch.save/load -> a fresh optimizer's load_state_dict


@st.composite
def changes(draw: st.DrawFn, name: str, n: int, nesterov: bool, clipped: bool) -> dict:
    def per(low: float, high: float) -> Any:
        one = st.floats(low, high)
        return draw(one | st.lists(one, min_size=n, max_size=n))

    keys = ["lr", "weight_decay"] + (["momentum"] if name == "sgd" else ["betas", "eps"])
    keys += ["max_grad_norm"] if clipped else []
    out = {}
    for key in draw(st.lists(st.sampled_from(keys), unique=True, max_size=3)):
        if key == "lr":
            out[key] = per(0.0, 0.5)
        elif key == "weight_decay":
            out[key] = per(0.0, 0.3)
        elif key == "momentum":
            out[key] = per(0.05 if nesterov else 0.0, 0.95)
        elif key == "betas":
            out[key] = (per(0.0, 0.95), per(0.5, 0.999))
        elif key == "eps":
            out[key] = per(1e-8, 1e-3)
        else:
            out[key] = draw(
                st.lists(st.floats(0.01, 2.0) | st.just(math.inf), min_size=n, max_size=n)
            )
    return out


@st.composite
def schedules(draw: st.DrawFn, max_batch: int = 4) -> tuple:
    """``(name, batch, keywords, dtype, turns)``: a run with pauses, changes and reloads."""
    name, n, keywords = draw(hyper_cases(max_batch=max_batch))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    clipped = keywords["max_grad_norm"] is not None
    turns = [
        Turn(
            active=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
            change=draw(st.just({}) | changes(name, n, keywords.get("nesterov", False), clipped)),
            factor=draw(st.none() | st.floats(0.1, 2.0)),
            reload=draw(st.booleans()),
        )
        for _ in range(draw(st.integers(1, 4)))
    ]
    return name, n, keywords, dtype, turns


def stacked(n: int, dtype: Any, seed: int) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn((n, *shape), generator=gen, dtype=dtype).requires_grad_()
        for shape in MEMBER_SHAPES
    ]


def run_members(name, n, keywords, dtype, turns, seed=0, blocks=False):
    """The stacked parameters and optimizer after `turns` (random gradients each step).

    With `blocks`, Adam's CPU update runs in blocks of two columns: large parameters'
    path, on small ones.
    """
    params = stacked(n, dtype, seed)
    opt = member_optimizer(params, name, n, **keywords)
    gen = torch.Generator().manual_seed(seed + 1)
    sizes = {"_BLOCK_BYTES": 1, "_MIN_COLUMNS": 2}
    with mock.patch.multiple(batching_optim, **sizes) if blocks else contextlib.nullcontext():
        for turn in turns:
            if turn.reload:
                buffer = io.BytesIO()
                torch.save(opt.state_dict(), buffer)
                buffer.seek(0)
                opt = member_optimizer(params, name, n, **keywords)
                opt.load_state_dict(torch.load(buffer))
            opt.set_hyper(active=turn.active, **turn.change)
            if turn.factor is not None:
                opt.param_groups[0]["lr"] = turn.factor
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen, dtype=dtype)
            opt.step()
    return params, opt


def run_reference(name, n, keywords, dtype, turns, i, seed=0):
    """Member i alone under torch.optim: steps only while active, same changes and grads."""
    own = [p[i].detach().clone().requires_grad_() for p in stacked(n, dtype, seed)]
    values = {k: member_value(v, i) for k, v in keywords.items() if k != "max_grad_norm"}
    clip = member_value(keywords["max_grad_norm"], i)
    ref = TORCH[name](own, **values)
    rate, factor = values["lr"], 1.0
    gen = torch.Generator().manual_seed(seed + 1)
    for turn in turns:
        for key, value in turn.change.items():
            if key == "max_grad_norm":
                clip = value[i]
            elif key == "lr":
                rate = member_value(value, i)
            else:
                ref.param_groups[0][key] = member_value(value, i)
        factor = factor if turn.factor is None else turn.factor
        ref.param_groups[0]["lr"] = rate * factor
        for q in own:
            q.grad = torch.randn((n, *q.shape), generator=gen, dtype=dtype)[i]
        if turn.active[i]:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(own, clip)
            ref.step()
    return own, ref


@settings(max_examples=40)
@given(run=schedules(), blocks=st.booleans())
def test_law_every_member_steps_as_torch_optim_alone(run, blocks):
    """Pauses, set_hyper, LR factors and state_dict reloads between steps, float32 and
    float64, per-member and shared values, whole or blocked: member i equals torch.optim
    run on member i alone (its parameters, its state, its step count)."""
    name, n, keywords, dtype, turns = run
    params, opt = run_members(name, n, keywords, dtype, turns, blocks=blocks)
    for i in range(n):
        own, ref = run_reference(name, n, keywords, dtype, turns, i)
        stepped = sum(turn.active[i] for turn in turns)
        for p, q in zip(params, own, strict=True):
            np.testing.assert_allclose(p[i].detach(), q.detach(), **CLOSE[dtype])
            mine, theirs = opt.state[p], ref.state[q]
            assert mine["step"].dtype == torch.float64 and mine["step"].shape == (n,)
            assert float(mine["step"][i]) == stepped
            if "step" in theirs:
                assert float(theirs["step"]) == stepped
            for slot in SLOTS:
                if theirs.get(slot) is not None:
                    np.testing.assert_allclose(mine[slot][i], theirs[slot], **CLOSE[dtype])


@settings(max_examples=40)
@given(run=schedules(), blocks=st.booleans())
def test_law_pausing_members_changes_no_other_member_bit_for_bit(run, blocks):
    """The masked path (some member inactive) against the fast one (all active): a member
    active throughout is bit for bit the same in both; one never active is bit for bit
    where it started, its state zero."""
    name, n, keywords, dtype, turns = run
    everyone = [dataclasses.replace(t, active=[True] * n) for t in turns]
    masked, opt = run_members(name, n, keywords, dtype, turns, blocks=blocks)
    fast, fast_opt = run_members(name, n, keywords, dtype, everyone, blocks=blocks)
    start = stacked(n, dtype, 0)
    for i in range(n):
        always = all(t.active[i] for t in turns)
        never = not any(t.active[i] for t in turns)
        for p, q, p0 in zip(masked, fast, start, strict=True):
            mine, theirs = opt.state[p], fast_opt.state[q]
            if always:
                assert torch.equal(p[i], q[i])
                assert all(torch.equal(mine[k][i], theirs[k][i]) for k in mine)
            if never:
                assert torch.equal(p[i], p0[i]) and torch.equal(
                    torch.signbit(p[i]), torch.signbit(p0[i])
                )
                assert all(not mine[k][i].any() for k in mine)


def test_a_step_count_changed_by_hand_is_read_back():
    """Adam keeps the step counts on the host between steps; a count changed in place
    (or a loaded state) is read again, as torch.optim.Adam reads its own."""
    params = stacked(2, torch.float64, 0)
    opt = member_optimizer(params, "adam", 2, lr=[0.1, 0.01])
    own = [[p[i].detach().clone().requires_grad_() for p in params] for i in range(2)]
    refs = [torch.optim.Adam(o, lr=lr) for o, lr in zip(own, [0.1, 0.01], strict=True)]
    gen = torch.Generator().manual_seed(0)
    for turn in range(3):
        grads = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in params]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        for i, (o, ref) in enumerate(zip(own, refs, strict=True)):
            for q, g in zip(o, grads, strict=True):
                q.grad = g[i]
            if turn == 2:  # both forget their first two steps' bias corrections
                for q in o:
                    ref.state[q]["step"].zero_()
        if turn == 2:
            for p in params:
                opt.state[p]["step"].zero_()
        opt.step()
        for ref in refs:
            ref.step()
    for i, o in enumerate(own):
        for p, q in zip(params, o, strict=True):
            np.testing.assert_allclose(p[i].detach(), q.detach(), **TIGHT)
            assert float(opt.state[p]["step"][i]) == 1.0


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_starts_each_members_buffer_as_torch_does_signed_zeros_too(nesterov):
    """torch's first momentum step copies d_p into the buffer (a -0.0 stays -0.0); later
    steps decay and add. Member 1 starts a step later than member 0 (it was paused)."""
    params = [torch.tensor([[-0.0, 0.0, 1.0], [-0.0, 0.0, 1.0]]).requires_grad_()]
    opt = member_optimizer(params, "sgd", 2, lr=0.5, momentum=[0.9, 0.5], nesterov=nesterov)
    own = [params[0][i].detach().clone().requires_grad_() for i in range(2)]
    refs = [
        torch.optim.SGD([q], lr=0.5, momentum=m, nesterov=nesterov)
        for q, m in zip(own, [0.9, 0.5], strict=True)
    ]
    for active in ([True, False], [True, True], [True, True]):
        opt.set_active(active)
        params[0].grad = torch.tensor([[-0.0, -0.0, 0.5]] * 2)
        opt.step()
        for i, (q, ref) in enumerate(zip(own, refs, strict=True)):
            q.grad = torch.tensor([-0.0, -0.0, 0.5])
            if active[i]:
                ref.step()
    for i, q in enumerate(own):
        mine, theirs = params[0][i].detach(), q.detach()
        assert torch.equal(mine, theirs) and torch.equal(mine.signbit(), theirs.signbit())
        buf = opt.state[params[0]]["momentum_buffer"][i]
        assert torch.equal(buf.signbit(), refs[i].state[q]["momentum_buffer"].signbit())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_on_cuda_members_step_as_on_the_cpu_without_host_syncs(name):
    """Off the CPU: one bucket of whole tensors, factors uploaded from pinned memory; after
    the first step (which builds the plan) a step never waits for the device."""
    keywords = {"lr": [0.1, 0.01, 0.2], "weight_decay": 0.1, "max_grad_norm": [1.0, math.inf, 0.5]}
    if name == "sgd":
        keywords["momentum"] = [0.9, 0.0, 0.5]
    runs = []
    for device in ("cpu", "cuda"):
        params = [p.detach().to(device).requires_grad_() for p in stacked(3, torch.float64, 0)]
        opt = member_optimizer(params, name, 3, active=[True, False, True], **keywords)
        gen = torch.Generator().manual_seed(1)
        for turn in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(device)
            if device == "cuda" and turn:
                torch.cuda.set_sync_debug_mode("error")
            try:
                opt.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        runs.append([p.detach().cpu() for p in params])
    for cpu, cuda in zip(*runs, strict=True):
        np.testing.assert_allclose(cuda, cpu, rtol=1e-10, atol=1e-12)


def test_members_all_paused_leave_everything_as_it_was():
    params = stacked(3, torch.float32, 0)
    opt = member_optimizer(params, "adamw", 3, lr=0.1, weight_decay=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    before = [p.detach().clone() for p in params]
    states = [{k: v.clone() for k, v in opt.state[p].items()} for p in params]
    opt.set_active([False] * 3)
    opt.step()
    for p, old, state in zip(params, before, states, strict=True):
        assert torch.equal(p, old)
        assert all(torch.equal(opt.state[p][k], v) for k, v in state.items())


# -- plain torch optimizers over bm.parameters(): which keep members isolated -----------------

OPT = torch.optim
ISOLATED = {
    "SGD nesterov, weight decay": lambda p: OPT.SGD(
        p, lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True
    ),
    "SGD foreach": lambda p: OPT.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "SGD fused": lambda p: OPT.SGD(p, lr=0.1, momentum=0.9, fused=True),
    "Adam": lambda p: OPT.Adam(p, lr=0.1, weight_decay=0.1),
    "Adam foreach": lambda p: OPT.Adam(p, lr=0.1, foreach=True),
    "Adam fused": lambda p: OPT.Adam(p, lr=0.1, fused=True),
    "Adam amsgrad": lambda p: OPT.Adam(p, lr=0.1, amsgrad=True),
    "AdamW": lambda p: OPT.AdamW(p, lr=0.1),
    "AdamW foreach": lambda p: OPT.AdamW(p, lr=0.1, foreach=True),
    "AdamW fused": lambda p: OPT.AdamW(p, lr=0.1, fused=True),
    "RMSprop centered": lambda p: OPT.RMSprop(p, lr=0.1, momentum=0.5, centered=True),
    "Adagrad": lambda p: OPT.Adagrad(p, lr=0.1),
    "Adadelta": lambda p: OPT.Adadelta(p),
    "Adamax": lambda p: OPT.Adamax(p),
    "NAdam": lambda p: OPT.NAdam(p),
    "RAdam": lambda p: OPT.RAdam(p),
    "Rprop": lambda p: OPT.Rprop(p),
    "ASGD": lambda p: OPT.ASGD(p),
    "member_optimizer adamw": lambda p: member_optimizer(p, "adamw", 2, lr=0.1, max_grad_norm=0.1),
}
MIXING = {
    "Adafactor": (lambda p: OPT.Adafactor(p), False, False),
    "LBFGS": (lambda p: OPT.LBFGS(p, lr=0.1), False, True),
    "SGD after clip_grad_norm_ over bm.parameters()": (lambda p: OPT.SGD(p, lr=0.1), True, False),
}


def trajectory(make: Any, scale: float, clip: bool = False, closure: bool = False) -> list:
    """Member 1's parameters after 3 steps when member 0's loss is scaled by `scale`."""
    bm = batched(2)
    bm.match_gradient_layout = False  # LBFGS flattens gradients with .view(-1)
    opt = make(bm.parameters())
    x, weight = data(2), torch.tensor([scale, 1.0], dtype=torch.float64)

    def loss():
        opt.zero_grad()
        value = (bm(x).pow(2).sum((1, 2)) * weight).sum()
        value.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(bm.parameters(), 0.1)
        return value

    for _ in range(3):
        if closure:
            opt.step(loss)
        else:
            loss()
            opt.step()
    return [p[1].detach().clone() for p in bm.parameters()]


@pytest.mark.parametrize("name", list(ISOLATED))
def test_elementwise_optimizers_keep_members_isolated(name):
    alone, perturbed = trajectory(ISOLATED[name], 1.0), trajectory(ISOLATED[name], 3.0)
    assert all(torch.equal(a, b) for a, b in zip(alone, perturbed, strict=True))


@pytest.mark.parametrize("name", list(MIXING))
def test_global_quantities_mix_members(name):
    make, clip, closure = MIXING[name]
    alone = trajectory(make, 1.0, clip, closure)
    perturbed = trajectory(make, 3.0, clip, closure)
    assert not all(torch.equal(a, b) for a, b in zip(alone, perturbed, strict=True))


def test_grad_scaler_skips_every_member_when_one_overflows():
    bm = batched(2)
    opt = OPT.SGD(bm.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    before = [p[1].detach().clone() for p in bm.parameters()]
    out = bm(data(2))
    loss = out[0].sum() * math.inf + out[1].pow(2).sum()  # only member 0 overflows
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert all(
        torch.equal(a, p[1]) for a, p in zip(before, bm.parameters(), strict=True)
    )  # 1 did not move


def test_muon_refuses_stacked_members():
    with pytest.raises(ValueError, match="only supports 2D parameters"):
        OPT.Muon([p for p in batched(2).parameters() if p.dim() == 3])


@settings(max_examples=12)
@given(
    name=st.sampled_from(["adam", "adamw"]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_large_members_step_as_each_alone_with_torch_adam(name, dtype, transposed, seed):
    """Law: members of 40k elements and more (stepped member by member by torch's fused
    kernel) follow torch.optim.Adam/AdamW on each member alone, with per-member lr, betas,
    eps and weight decay, in any dense layout of the member's block (vmap's transposed
    gradients), over steps with a scheduler factor change."""
    assert batching_optim._FUSED_MIN <= 40_000
    g = torch.Generator().manual_seed(seed)
    n = 3
    raw = torch.randn(n, 200, 200, dtype=dtype, generator=g)
    stacked = raw.transpose(1, 2).contiguous().transpose(1, 2) if transposed else raw.clone()
    bias = torch.randn(n, 7, dtype=dtype, generator=g)
    params = [nn.Parameter(stacked), nn.Parameter(bias)]
    lrs, wds = [1e-3, 3e-3, 1e-2], [0.0, 0.01, 0.1]
    betas = ([0.9, 0.8, 0.95], [0.999, 0.99, 0.9])
    eps = [1e-8, 1e-6, 1e-4]
    opt = member_optimizer(params, name, n, lr=lrs, betas=betas, eps=eps, weight_decay=wds)
    alone = [[nn.Parameter(p.detach()[i].clone()) for p in params] for i in range(n)]
    kind = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    plain = [
        kind(ps, lr=lrs[i], betas=(betas[0][i], betas[1][i]), eps=eps[i], weight_decay=wds[i])
        for i, ps in enumerate(alone)
    ]
    for step in range(3):
        grads = [torch.randn(p.shape, dtype=dtype, generator=g) for p in params]
        for p, grad in zip(params, grads, strict=True):
            p.grad = torch.empty_like(p).copy_(grad)  # laid out as autograd lays it: like p
        if step == 2:  # a scheduler's factor scales every member's rate
            opt.param_groups[0]["lr"] = 0.5
            for o, lr in zip(plain, lrs, strict=True):
                o.param_groups[0]["lr"] = 0.5 * lr
        opt.step()
        for i, (ps, o) in enumerate(zip(alone, plain, strict=True)):
            for q, grad in zip(ps, grads, strict=True):
                q.grad = grad[i].clone()
            o.step()
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-13}
    for i, ps in enumerate(alone):
        for p, q in zip(params, ps, strict=True):
            torch.testing.assert_close(p.detach()[i], q.detach(), **tol)
    assert params[0].stride() == stacked.stride()  # updated in place, layout kept
    torch.testing.assert_close(
        opt.state[params[0]]["step"], torch.full((n,), 3.0, dtype=torch.float64)
    )


def test_zero_grad_and_groups_do_what_torchs_do_for_the_one_group():
    """zero_grad as torch's (None, or zeros in place); a second group is refused: the step
    reads only the first (a second group's tensors would silently never move)."""
    params = [nn.Parameter(torch.randn(2, 3)), nn.Parameter(torch.randn(2))]
    opt = member_optimizer(params, "adam", 2, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    kept = params[0].grad
    opt.zero_grad(set_to_none=False)
    assert params[0].grad is kept and torch.equal(kept, torch.zeros_like(kept))
    opt.zero_grad()
    assert all(p.grad is None for p in params)
    with pytest.raises(ArgumentError, match="member_optimizer holds one group"):
        opt.add_param_group({"params": [nn.Parameter(torch.randn(2, 4))]})
    with pytest.raises(ArgumentError, match="no tensor twice"):
        member_optimizer([params[0], params[0]], "sgd", 2, lr=0.1)


def test_a_batched_training_step_never_imports_torch_dynamo(tmp_path):
    """torch.optim's add_param_group and zero_grad import torch._dynamo (seconds on a CPU)
    on first use; a BatchModule sweep step, its strategy timing included, does not."""
    import subprocess
    import sys

    program = (
        "import sys, torch\n"
        "from torch import nn\n"
        "from dualtrain_torch import BatchModule, member_optimizer, batch_loss\n"
        "bm = BatchModule(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), 4,"
        " shared_input=True)\n"
        "opt = member_optimizer(bm, 'adam', 4, lr=[1e-3, 1e-2, 1e-1, 1.0])\n"
        "for _ in range(2):\n"
        "    loss = batch_loss(bm(torch.randn(5, 4)), torch.randint(0, 3, (5,)), 4)\n"
        "    opt.zero_grad()\n"
        "    loss.sum().backward()\n"
        "    opt.step()\n"
        "assert 'whole step' in bm.explain(), bm.explain()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    env = {**__import__("os").environ, "DUALTRAIN_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True,
        timeout=CHILD_TIMEOUT_S,
    )  # fmt: skip
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("size", [(6, 5), (3, 200, 200)])  # the vectorized, the fused path
def test_a_members_arithmetic_never_depends_on_the_other_members(size):
    """Member 0 ends bit for bit the same whether member 1 is paused, whether clipping is
    on with an infinite norm (not clipped), and whatever the gradient's layout."""
    g = torch.Generator().manual_seed(0)
    start = torch.randn(2, *size, generator=g)
    grads = [torch.randn(2, *size, generator=g) for _ in range(3)]

    def run(active=None, clip=None, transposed=False):
        p = nn.Parameter(start.clone())
        opt = member_optimizer([p], "adam", 2, lr=[1e-2, 1e-3], active=active, max_grad_norm=clip)
        for grad in grads:
            if transposed:
                grad = grad.transpose(-1, -2).contiguous().transpose(-1, -2)
            p.grad = grad.clone()
            opt.step()
        return p.detach()[0]

    base = run()
    for variant in (
        run(active=[True, False]),
        run(clip=[math.inf, math.inf]),
        run(transposed=True),
    ):
        assert torch.equal(variant, base)
