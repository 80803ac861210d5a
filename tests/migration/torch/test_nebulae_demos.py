"""Nebulae v0.5.15 programs on `dualtrain.compat.nebulae`, with only the import prefix changed.

The two programs in nebulae_programs.py make every call Nebulae's demo scripts make; the
laws below hold each compat part to Nebulae's code (github SeriaQ/Nebulae at cee8b56) and
to the plain torch way of doing the same thing.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from dualtrain.compat.retired import RetiredError
from dualtrain.errors import ArgumentError, DualtrainError
from dualtrain.fuel import FuelGenerator
from tests.migration import nebulae_programs

torch = pytest.importorskip("torch")
F = torch.nn.functional

import dualtrain.compat.nebulae as neb  # noqa: E402
from dualtrain.compat.nebulae.astrobase import dock  # noqa: E402
from dualtrain.compat.nebulae.fuel import depot  # noqa: E402

SIDE = nebulae_programs.SIDE


def _pack(root: str, name: str, rows: int, classes: int) -> str:
    folder = os.path.join(root, name + "_raw")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(rows)
    lines = [["image", "label"]]
    for i in range(rows):
        label = i % classes
        # each class a colour, with noise: learnable in a few steps
        base = np.array([60 * label, 255 - 50 * label, 120], np.int64)
        pixels = np.clip(base + rng.integers(-30, 30, (SIDE, SIDE, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i}.jpg"), quality=95)
        lines.append([f"{i}.jpg", str(label)])
    with open(os.path.join(folder, "list.csv"), "w", newline="") as f:
        csv.writer(f).writerows(lines)
    gen = FuelGenerator(folder, "list.csv", ["vuint8", "int64"], False)
    return gen.generate(os.path.join(root, name + ".hdf5"), SIDE, SIDE).paths[0]


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("nebulae_programs"))
    _pack(root, "train", 40, 4)
    _pack(root, "dev", 16, 4)
    return root


# ---- the programs, end to end ----------------------------------------------------------


def test_the_single_process_program_trains_and_anchors(packs):
    neb.toolkit.destine(3)
    out = nebulae_programs.single_process(packs, epochs=4)
    losses = out["losses"]
    assert out["train_mpe"] == 40 // 16  # in_same_size drops the short batch, as Nebulae
    assert len(losses) == 4 * out["train_mpe"] and np.isfinite(losses).all()
    assert np.mean(losses[-2:]) < np.mean(losses[:2])
    # the Comburant's output: float32, channel-first, in [-1, 1] after `* 2 - 1`
    images = out["images"]
    assert images.dtype == np.float32 and images.shape[1:] == (16, 3, 12, 12)
    assert images.min() >= -1 and images.max() <= 1 and images.std() > 0.05
    assert os.listdir(os.path.join(packs, "ckpt")), "tm.drop wrote no anchor"
    assert {"Acc.png", "Loss.png", "epochs.csv"} <= set(os.listdir(os.path.join(packs, "log")))
    assert 0 <= out["dev_acc"] <= 1


def test_the_multiverse_program_runs_on_two_workers_in_step(packs, monkeypatch):
    monkeypatch.setenv("NEBULAE_PROGRAM_ROOT", packs)
    mv = neb.law.Multiverse(nebulae_programs.several_processes, 2)
    assert neb.law.Multiverse is neb.cockpit.Multiverse
    out = mv()
    assert out["rank"] == 0
    assert out["mpe"] == 40 // (8 * 2)  # each worker serves its share of every epoch
    assert np.isfinite(out["losses"]).all()
    # DDP kept the workers' weights equal: their mean minus rank 0's is zero
    assert np.abs(out["weights"]).max() < 1e-6


def test_the_demo_spec_typo_stays_refused(packs):
    with pytest.raises(ArgumentError, match="data_specf\\['image'\\] must be a column type"):
        depot.Tank(os.path.join(packs, "train.hdf5"), {"image": "vunit8", "label": "int64"}, 8)


# ---- the namespace ---------------------------------------------------------------------


def test_importing_the_neutral_packages_loads_no_framework():
    code = (
        "import sys\n"
        "import dualtrain.compat.nebulae as neb\n"
        "from dualtrain.compat.nebulae.fuel import depot\n"
        "neb.aerolog, neb.cockpit, neb.law, neb.toolkit, neb.kit, neb.fuel, neb.astrobase\n"
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules, 'framework loaded'\n"
        "from dualtrain.compat.nebulae.astrobase import dock\n"
        "assert 'torch' in sys.modules and 'jax' not in sys.modules\n"
        "from dualtrain.compat.nebulae.astro import dock as d2\n"
        "assert d2.Conv is dock.Conv and neb.kit.Timer is neb.toolkit.Timer\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_model_zoo_and_graph_drawing_name_the_way_instead():
    from dualtrain.compat.nebulae.astrobase import hangar

    with pytest.raises(RetiredError, match=r"hangar\.VGG_16: Nebulae's model zoo"):
        hangar.VGG_16  # noqa: B018
    bp = neb.aerolog.BluePrint(hidden=["is_train"], verbose=True)
    with pytest.raises(ArgumentError, match=r"torch\.onnx\.export"):
        bp.paint(None)


# ---- laws: layers against plain torch --------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(
    size=st.tuples(st.integers(3, 12), st.integers(3, 12)),
    kernel=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    stride=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_conv_with_autopad_is_f_pad_then_conv(size, kernel, stride, seed):
    torch.manual_seed(seed)
    pad = dock.autoPad(size, kernel, stride)
    conv = dock.Conv(2, 3, kernel, stride=stride, padding=pad)
    x = torch.randn(2, 2, *size)
    module = conv.module()
    want = F.conv2d(F.pad(x, pad), module.conv.weight, module.conv.bias, stride=stride)
    got = conv(x)
    assert got.shape[2:] == tuple(-(-s // stride) for s in size)  # "same": ceil(in / stride)
    torch.testing.assert_close(got, want)
    # Nebulae's initializers: xavier-normal weights, zero bias (the defaults)
    assert torch.count_nonzero(module.conv.bias) == 0


@settings(max_examples=20, deadline=None)
@given(
    size=st.integers(2, 9),
    pads=st.lists(st.integers(0, 1), min_size=4, max_size=4),
    seed=st.integers(0, 2**31),
)
def test_pools_pad_with_zeros_as_nebulae(size, pads, seed):
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(seed)) - 1
    padded = F.pad(x, pads)  # zeros (Nebulae's ConstantPad), not -inf
    if min(padded.shape[2:]) < 2:
        return
    torch.testing.assert_close(dock.MaxPool((2, 2), padding=pads)(x), F.max_pool2d(padded, 2, 2))
    torch.testing.assert_close(dock.AvgPool((2, 2), padding=pads)(x), F.avg_pool2d(padded, 2, 2))
    glob = dock.MaxPool((-1, -1))(x)
    torch.testing.assert_close(glob, x.amax((2, 3), keepdim=True))


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 6), classes=st.integers(2, 5), seed=st.integers(0, 2**31))
def test_losses_and_metrics_equal_torch(rows, classes, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, classes, generator=g)
    y = torch.randint(0, classes, (rows,), generator=g)
    one_hot = F.one_hot(y, classes).float()
    torch.testing.assert_close(dock.SftmXE(is_one_hot=False)(x, y), F.cross_entropy(x, y))
    torch.testing.assert_close(dock.SftmXE(is_one_hot=True)(x, one_hot), F.cross_entropy(x, y))
    acc = (x.argmax(-1) == y).float().mean()
    torch.testing.assert_close(dock.AccCls(False, False)(x, y), acc)
    torch.testing.assert_close(dock.AccCls(False, True)(x, one_hot), acc)
    multi = (torch.rand(rows, classes, generator=g) > 0.5).float()
    want = ((torch.round(torch.sigmoid(x)) == multi).float().mean(-1) == 1).float().mean()
    torch.testing.assert_close(dock.AccCls(True, False)(torch.sigmoid(x), multi), want)


def test_dense_over_another_axis_is_the_plain_linear_there():
    dense = dock.Dense(3, 5, axis=1)
    x = torch.randn(2, 3, 4)
    fc = dense.module().fc
    torch.testing.assert_close(dense(x), fc(x.transpose(1, 2)).transpose(1, 2))
    with pytest.raises(ArgumentError, match="axis must be an int other than 0"):
        dock.Dense(3, 5, axis=0)


@settings(max_examples=10, deadline=None)
@given(
    lr=st.floats(0.01, 0.5),
    mmnt=st.floats(0.0, 0.95),
    wd=st.floats(0.0, 0.01),
    warmup=st.integers(0, 4),
    period=st.integers(1, 4),
)
def test_momentum_is_torch_sgd_with_nebulae_warmup_and_step_schedule(lr, mmnt, wd, warmup, period):
    torch.manual_seed(0)
    net = dock.Dense(4, 2)
    plain = torch.nn.Linear(4, 2)
    plain.load_state_dict({k.split(".")[-1]: v for k, v in net.state_dict().items()})
    optz = dock.Momentum(
        net, lr, mmnt=mmnt, wd=wd, lr_decay=dock.StepLR(period, 0.5), warmup=warmup
    )
    sgd = torch.optim.SGD(plain.parameters(), lr=lr, momentum=mmnt, weight_decay=wd)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    for step in range(10):
        # Nebulae's WarmUpWrapper zeroes the rate when made; its k-th step() sets mile k - 1
        # and the rate lr * mile / warmup while mile <= warmup, then steps the schedule. So
        # optimizer step n runs at 0, then lr * (n - 1) / warmup, reaching lr at n =
        # warmup + 1, where the StepLR starts counting.
        if not warmup:
            rate = lr * 0.5 ** (step // period)
        elif step <= warmup + 1:
            rate = lr * max(step - 1, 0) / warmup
        else:
            rate = lr * 0.5 ** ((step - warmup - 1) // period)
        for group in sgd.param_groups:
            group["lr"] = rate
        assert optz.optz.param_groups[0]["lr"] == pytest.approx(rate)
        optz(F.cross_entropy(net(x), y))
        sgd.zero_grad()
        F.cross_entropy(plain(x), y).backward()
        sgd.step()
    for got, want in zip(net.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got, want)


def test_warm_up_rates_are_nebulaes_own_sequence():
    # WarmUpWrapper(3, StepLR(2, 0.5)) stepped by hand through Nebulae's code
    want = [0, 0, 1 / 3, 2 / 3, 1, 1, 0.5, 0.5, 0.25]
    net = dock.Dense(2, 1)
    optz = dock.Momentum(net, 1.0, lr_decay=dock.StepLR(2, 0.5), warmup=3)
    got = []
    for _ in want:
        got.append(optz.optz.param_groups[0]["lr"])
        optz(net(torch.ones(1, 2)).sum())
    assert got == pytest.approx(want)
    state = optz.lr_decay.state_dict()
    again = dock.Momentum(net, 1.0, lr_decay=dock.StepLR(2, 0.5), warmup=3)
    again.lr_decay.load_state_dict(state)
    assert again.lr_decay.mile == optz.lr_decay.mile


@pytest.mark.parametrize(
    ("kind", "torch_kind", "options"),
    [
        ("Adam", torch.optim.Adam, {"betas": (0.8, 0.99)}),
        ("AdamW", torch.optim.AdamW, {"betas": (0.8, 0.99)}),
        ("Nesterov", torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
        ("RMSProp", torch.optim.RMSprop, {"momentum": 0.0}),
    ],
)
def test_the_other_optimizers_are_torch_optims(kind, torch_kind, options):
    torch.manual_seed(0)
    net = dock.Dense(4, 2)
    plain = torch.nn.Linear(4, 2)
    plain.load_state_dict({k.split(".")[-1]: v for k, v in net.state_dict().items()})
    betas = {"mmnt1": 0.8, "mmnt2": 0.99} if "Adam" in kind else {}
    optz = getattr(dock, kind)(net, 0.01, wd=0.001, **betas)
    ref = torch_kind(plain.parameters(), lr=0.01, weight_decay=0.001, **options)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    for _ in range(4):
        optz(F.cross_entropy(net(x), y))
        ref.zero_grad()
        F.cross_entropy(plain(x), y).backward()
        ref.step()
    for got, want in zip(net.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got, want)


def test_names_not_carried_over_say_what_to_use():
    with pytest.raises(RetiredError, match=r"dock\.BN is not provided.*dualtrain\.dock\.BatchNorm"):
        dock.BN  # noqa: B018
    with pytest.raises(RetiredError, match=r"mse_loss"):
        from dualtrain.compat.nebulae.astrobase.dock import MSE  # noqa: F401
    with pytest.raises(AttributeError):
        dock.NotANebulaeName  # noqa: B018
    with pytest.raises(RetiredError, match="DashBoard draws its live view"):
        neb.aerolog.CtrlPanel  # noqa: B018


def test_step_with_lr_params_and_grad_accum_and_limits():
    net = dock.Dense(3, 1)
    optz = dock.Momentum(
        net, 0.1, lr_decay=dock.STEP, lr_params=(2, 0.5), grad_accum=2, grad_limit=0.01
    )
    before = [p.detach().clone() for p in net.parameters()]
    x = torch.randn(4, 3)
    optz(net(x).sum())
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    optz(net(x).sum())  # the second of grad_accum: one step with both gradients, clipped
    moved = [(b - a).abs().max().item() for a, b in zip(before, net.parameters(), strict=True)]
    assert 0 < max(moved) <= 0.1 * 0.01 * (1 + 1e-5)  # float32 steps
    with pytest.raises(ArgumentError, match="lr_params must be \\(period, factor\\)"):
        dock.Momentum(net, 0.1, lr_decay=dock.STEP)
    with pytest.raises(ArgumentError, match="grad_accum must be an int >= 1"):
        dock.Momentum(net, 0.1, grad_accum=0)


# Nebulae v0.5.15's optimizer signatures: (moment defaults, scope), every argument positional.
NEBULAE_OPTIMIZERS = {
    "Momentum": ((0.9,), "MOMENTUM", torch.optim.SGD),
    "Nesterov": ((0.9,), "NESTEROV", torch.optim.SGD),
    "RMSProp": ((0.0,), "RMSPROP", torch.optim.RMSprop),
    "Adam": ((0.9, 0.999), "ADAM", torch.optim.Adam),
    "AdamW": ((0.9, 0.999), "ADAMW", torch.optim.AdamW),
}


@pytest.mark.parametrize("name", sorted(NEBULAE_OPTIMIZERS))
@settings(max_examples=10, deadline=None)
@given(
    moments=st.lists(st.floats(0.01, 0.99), min_size=2, max_size=2),
    wd=st.sampled_from([0, 1e-3]),
    accum=st.integers(1, 3),
    scope=st.text("ABCXYZ", min_size=1, max_size=6),
)
def test_optimizers_take_nebulaes_arguments_by_position(name, moments, wd, accum, scope):
    """Any argument by position equals it by keyword; left out, Nebulae's defaults hold."""
    defaults, default_scope, kind = NEBULAE_OPTIMIZERS[name]
    cls = getattr(dock, name)
    net = dock.Dense(3, 1)
    given_moments = moments[: len(defaults)]
    by_position = cls(net, 0.1, *given_moments, wd, None, 0, -1, accum, None, scope)
    names = ["mmnt"] if len(defaults) == 1 else ["mmnt1", "mmnt2"]
    by_name = cls(net, 0.1, **dict(zip(names, given_moments, strict=True)), wd=wd,
                  grad_accum=accum, scope=scope)  # fmt: skip
    plain = cls(net, 0.1)
    assert by_position.scope == by_name.scope == scope and plain.scope == default_scope
    assert by_position.grad_accum == by_name.grad_accum == accum
    for optz in (by_position, by_name, plain):
        assert type(optz.optz) is kind
    group, same, default = (o.optz.param_groups[0] for o in (by_position, by_name, plain))
    key = "betas" if len(defaults) == 2 else "momentum"
    assert group[key] == same[key] and tuple(np.atleast_1d(group[key])) == tuple(given_moments)
    assert tuple(np.atleast_1d(default[key])) == defaults
    assert group["weight_decay"] == same["weight_decay"] == wd
    assert group.get("nesterov", False) == (name == "Nesterov")


@pytest.mark.parametrize("name", sorted(NEBULAE_OPTIMIZERS))
def test_optimizer_signatures_are_nebulaes(name):
    """help() shows Nebulae's parameters, in its order, with its defaults; None stays None."""
    import inspect

    defaults, scope, _ = NEBULAE_OPTIMIZERS[name]
    params = inspect.signature(getattr(dock, name)).parameters
    moments = ["mmnt"] if len(defaults) == 1 else ["mmnt1", "mmnt2"]
    nebulae = ["hull", "lr", *moments, "wd", "lr_decay", "warmup", "grad_limit", "grad_accum",
               "update_scope", "scope"]  # fmt: skip
    assert list(params)[: len(nebulae)] == nebulae  # then dualtrain's lr_params
    assert tuple(params[m].default for m in moments) == defaults
    assert params["scope"].default == scope
    assert getattr(dock, name)(dock.Dense(3, 1), 0.1, scope=None).scope is None  # as Nebulae's


def test_pool_signatures_are_nebulaes():
    import inspect

    for cls, scope in ((dock.MaxPool, "MPOOL"), (dock.AvgPool, "APOOL")):
        params = inspect.signature(cls).parameters
        assert list(params) == ["kernel", "stride", "padding", "scope"]
        assert params["scope"].default == scope and cls((2, 2)).scope == scope


# ---- the Craft -------------------------------------------------------------------------


class Pair(dock.Craft):
    def __init__(self, scope="PAIR"):
        super().__init__(scope)
        self.a = dock.Dense(3, 3)
        self.b = dock.Dense(3, 2)

    def run(self, x):
        self["mid"] = self.a(x)
        return self.b(self["mid"])


def test_children_in_any_container_or_under_a_plain_craft_share_their_weights():
    import dualtrain
    import dualtrain_torch
    from dualtrain.craft import dock as neutral

    class InSequence(dock.Craft):
        def __init__(self):
            super().__init__("SEQ")
            self.seq = neutral.Sequential(dock.Dense(3, 3), dock.Dense(3, 2))

        def run(self, x):
            return self.seq.layers[1](self.seq.layers[0](x))

    class Plain(dualtrain.Craft):
        def __init__(self):
            super().__init__("PLAIN")
            self.fc = dock.Dense(3, 2)

        def run(self, x):
            return self.fc(x)

    x = torch.randn(4, 3)
    seq = InSequence()
    before = seq(x).detach().clone()
    dock.Momentum(seq, 0.5)(seq(x).sum())
    assert not torch.allclose(before, seq(x))  # the optimizer stepped what runs
    plain = dualtrain_torch.realize(Plain())
    assert {id(p) for p in plain.parameters()} == {id(p) for p in plain.craft.fc.parameters()}
    before = plain(x).detach().clone()
    sgd = torch.optim.SGD(plain.parameters(), 0.5)
    plain(x).sum().backward()
    sgd.step()
    assert not torch.allclose(before, plain(x))


def test_initial_weights_follow_torchs_generator_as_in_nebulae():
    def weights():
        return dock.Conv(3, 4, (3, 3), w_init=dock.Void()).module().conv.weight.detach()

    torch.manual_seed(1)
    first = weights()
    torch.manual_seed(2)
    second = weights()
    torch.manual_seed(1)
    assert torch.equal(weights(), first) and not torch.equal(first, second)


def test_a_craft_and_its_children_share_one_set_of_weights():
    pair = Pair()
    x = torch.randn(4, 3)
    direct = pair.b(pair.a(x))
    torch.testing.assert_close(pair(x), direct)
    assert pair["mid"].shape == (4, 3) and pair["a/"] is pair.a
    # an optimizer on the child steps the weights the parent runs
    optz = dock.Momentum(pair.b, 0.5)
    optz(pair(x).sum())
    torch.testing.assert_close(pair(x), pair.b(pair.a(x)))
    assert not torch.allclose(pair(x), direct)
    assert len(list(pair.parameters())) == 4
    assert pair.gear(False) is pair and pair.training is False  # gear returns the Craft
    assert pair.gear(True).training is True and pair.gear(neb.cockpit.Engine(device="cpu")) is pair
    with pytest.raises(KeyError, match="keeps no tensor 'nope'"):
        pair["nope"]
    with pytest.raises(ArgumentError, match="scope must be a str"):
        pair.scope = 3


def test_conv_padding_forms_are_checked():
    with pytest.raises(ArgumentError, match="padding must be an int >= 0 or 4 of them"):
        dock.Conv(1, 1, (3, 3), padding=(1, 1))
    with pytest.raises(ArgumentError, match="b_init must be an initializer"):
        dock.Conv(1, 1, (3, 3), b_init="zeros")
    assert dock.Conv(1, 1, (3, 3), b_init=None).module().conv.bias is None
    assert dock.Conv(1, 1, (3, 3), b_init=dock.Void()).module().conv.bias is None


def test_autopad_without_a_size_is_nebulae_margin():
    # Nebulae's margin k + (d - 1)(k - 1) - s, split low / high, last axis first
    assert dock.autoPad(None, (3, 5), (1, 2), 1) == [1, 2, 1, 1]
    assert neb.toolkit.autoPad((), (3,), 1, 2) == [2, 2]


# ---- Fuel ------------------------------------------------------------------------------


def _jpeg(pixels: np.ndarray) -> np.ndarray:
    import io

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return np.frombuffer(buf.getvalue(), np.uint8)


@settings(max_examples=15, deadline=None)
@given(h=st.integers(2, 10), w=st.integers(2, 10), seed=st.integers(0, 2**31))
def test_comburant_returns_float_images_in_unit_range_from_bytes_or_arrays(h, w, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3)).astype(np.uint8)
    want = pixels.astype(np.float32) / 255
    np.testing.assert_array_equal(depot.Comburant(is_encoded=True)(_jpeg(pixels)), want)
    np.testing.assert_array_equal(depot.Comburant()(pixels), want)
    chw = depot.Comburant(depot.HWC2CHW())(pixels)
    np.testing.assert_array_equal(chw, want.transpose(2, 0, 1))
    flipped = depot.Comburant(depot.Flip(depot.VERTICAL))(pixels)
    np.testing.assert_array_equal(flipped, want[:, ::-1])
    upside = depot.Comburant(depot.Flip(1.0, depot.HORIZONTAL))(pixels)
    np.testing.assert_array_equal(upside, want[::-1])
    np.testing.assert_array_equal(depot.Comburant(depot.Brighten(0))(pixels), want)
    np.testing.assert_array_equal(depot.Comburant(depot.Rotate(0))(pixels), want)
    assert depot.Comburant(depot.Resize((3, 5)))(pixels).shape == (3, 5, 3)
    crop = depot.Comburant(depot.Crop((2, 2)))(pixels)
    assert crop.shape == (2, 2, 3) and crop.dtype == np.float32
    grey = depot.Comburant(lambda image: image.convert("L"))(pixels)  # any per-image callable
    assert grey.shape == (h, w) and grey.dtype == np.float32
    frames = depot.Comburant(depot.Crop((2, 2)), depot.Brighten(0.5))([pixels, pixels])
    np.testing.assert_array_equal(frames[0], frames[1])  # one draw serves every frame


def test_comburant_and_transforms_refuse_bad_arguments():
    with pytest.raises(ArgumentError, match="HWC2CHW\\(\\) goes last"):
        depot.Comburant(depot.HWC2CHW(), depot.Resize((2, 2)))
    with pytest.raises(ArgumentError, match=r"axial must be depot\.HORIZONTAL or depot\.VERTICAL"):
        depot.Flip(3)
    with pytest.raises(ArgumentError, match="size must be \\(height, width\\)"):
        depot.Resize(4)
    with pytest.raises(ArgumentError, match="image must be a PIL image"):
        depot.Comburant()("not an image")


def test_tank_by_one_key_serves_every_column_and_hands_fetch_decoded_and_raw_cells(packs):
    seen = {}

    def fetch(data, idx):
        seen["image"], seen["raw"] = data["image"][idx], data.raw["image"][idx]
        return {"label": data["label"][idx].astype("int64")}

    tank = depot.Tank(os.path.join(packs, "train.hdf5"), "image", 16, shuffle=False, fetch_fn=fetch)
    batch = tank.next()
    assert tank.MPE == 40 // 16 and len(tank) == 40
    assert isinstance(batch["label"], torch.Tensor) and batch["label"].tolist() == [
        i % 4 for i in range(16)
    ]
    assert seen["image"].shape == (SIDE, SIDE, 3)  # decoded, as the brochure's fetcher reads
    assert seen["raw"].ndim == 1 and seen["raw"].dtype == np.uint8  # the bytes Nebulae stored
    short = depot.Tank(
        os.path.join(packs, "train.hdf5"), "image", 16, in_same_size=False, fetch_fn=fetch
    )
    assert short.MPE == 3
    with pytest.raises(ArgumentError, match="data_specf must be a column among"):
        depot.Tank(os.path.join(packs, "train.hdf5"), "nope", 16)


# ---- cockpit and aerolog ---------------------------------------------------------------


def test_dashboard_counts_miles_and_epochs_from_zero(tmp_path):
    db = neb.aerolog.DashBoard(log_path=str(tmp_path), format={"Loss": [".3f", "raw"]})
    for epoch in range(2):
        for mile in range(3):
            db.gauge({"Loss": float(epoch * 10 + mile)}, mile, epoch, 3, "TRAIN")
    assert db.read("Loss", "TRAIN") == pytest.approx(11.0)
    assert db.read("Loss", "TRAIN", 1) == pytest.approx(1.0)  # read's epochs count from 1
    with pytest.raises(ArgumentError, match="mile must be an int >= 0"):
        db.gauge({"Loss": 1.0}, -1, 0, 3, "TRAIN")
    with pytest.raises(ArgumentError, match="mile must be a step in \\[0, mpe=3\\)"):
        db.gauge({"Loss": 1.0}, 3, 0, 3, "TRAIN")
    with pytest.raises(ArgumentError, match="read's epoch counts from 1"):
        db.read("Loss", "TRAIN", 0)
    assert db.gauge({"Loss": 1.0}, np.int64(0), np.int64(0), 3, "TRAIN") is None  # NumPy ints
    # Nebulae's config rank: a rank other than 0 draws nothing and reads None
    quiet = neb.aerolog.DashBoard({"log_path": str(tmp_path / "r1"), "rank": 1})
    quiet.gauge({"Loss": 1.0}, 0, 0, 1, "TRAIN")
    assert quiet.rank == 1 and quiet.read("Loss", "TRAIN") is None
    assert neb.cockpit.Engine({"device": "cpu", "rank": 1}).local_rank == 1


def test_engine_and_time_machine_take_nebulae_arguments(tmp_path):
    ng = neb.cockpit.Engine({"device": "cpu"})
    assert ng.device == "CPU" and neb.cockpit.Engine(None, "cpu").device == "CPU"
    t = ng.coat(np.ones((2, 2), np.float32), as_const=False)
    assert t.requires_grad and dock.coat(np.zeros(3)).device.type == "cpu"
    assert ng.shell(torch.tensor(2.5)) == 2.5
    with pytest.raises(ArgumentError, match="multi_piston=True"):
        neb.cockpit.Engine(device="cpu", multi_piston=True)
    with pytest.raises(ArgumentError, match="device must be 'gpu' or 'cpu'"):
        neb.cockpit.Engine(device="tpu")
    pair = Pair("anchor")
    optz = dock.Momentum(pair, 0.1)
    optz(pair(torch.randn(2, 3)).sum())
    tm = neb.cockpit.TimeMachine(None, str(tmp_path), str(tmp_path))
    tm.drop(pair, optz)
    saved = {k: v.clone() for k, v in pair.state_dict().items()}
    optz(pair(torch.randn(2, 3)).sum())
    tm.to(pair, optz)
    for key, value in pair.state_dict().items():
        torch.testing.assert_close(value, saved[key])


def test_timer_and_executor_keep_results():
    timed = neb.toolkit.Timer(lambda a, b: (a, b))
    seconds, a, b = timed(1, 2)
    assert seconds >= 0 and (a, b) == (1, 2)
    assert neb.toolkit.Timer(lambda: 5)()[1:] == (5,)
    mv = neb.law.Multiverse(lambda mv: None, 1)
    step = mv.Executor(lambda x: x * 2)
    assert step(21) == 42
    with pytest.raises(DualtrainError, match="func must be the step function"):
        mv.Executor(3)

    # on the class, the brochure's form: the main function, run on one worker when called
    @neb.law.Multiverse.Executor
    def launch(mv, value):
        return isinstance(mv, neb.law.Multiverse), mv.nworld, value

    assert launch(None, 7) == (True, 1, 7)
    assert launch.__wrapped__ is not None


def test_a_one_worker_multiverse_syncs_a_craft_and_returns_the_data_after_it(packs):
    def universe(mv):
        net = Pair("one")

        def fetch(data, idx):
            return {"label": data["label"][idx].astype("int64")}

        tank = depot.Tank(os.path.join(packs, "train.hdf5"), "image", 8, fetch_fn=fetch)
        with pytest.raises(TypeError):
            mv.sync(net)  # Nebulae's sync takes the data too
        synced, same = mv.sync(net, tank)
        loss = torch.tensor(2.0, requires_grad=True)
        reduced = mv.reduce(loss * 3)
        reduced.backward()  # the gradient passes through the reduce
        return synced, same is tank, loss.grad.item(), reduced.item()

    synced, same, grad, value = neb.law.Multiverse(universe, 1)()
    assert isinstance(synced, torch.nn.Module) and same and grad == 3.0 and value == 6.0
