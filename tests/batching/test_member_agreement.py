"""Members stacked from separate models must agree on what the batch takes from the first.

A batch holds one ``requires_grad`` per stacked parameter, runs one mode, and runs every
member through the first member's code, settings and hooks. A member that differs in any
of these was once trained (or frozen, or run) as the first member: now it is refused with
an ArgumentError naming the member, the place and both values, before anything is built.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import Craft, dock
from dualtrain.batching import members
from dualtrain.errors import ArgumentError


class Scaled(Craft):
    """Dense scaled by a setting: members of one class whose runs differ by `scale`."""

    def __init__(self, scale: float = 1.0, act: str = "tanh") -> None:
        super().__init__("SCALED")
        self.fc = dock.Dense(3, 2)
        self.scale, self.act = scale, act

    def run(self, x):
        h = self.fc(x) * self.scale
        return dock.tanh(h) if self.act == "tanh" else dock.relu(h)


# -- the neutral comparison ---------------------------------------------------------------


@given(st.floats(allow_nan=True), st.floats(allow_nan=True))
def test_config_difference_is_equality_of_settings(a: float, b: float) -> None:
    """Two Crafts differ exactly where a setting differs (NaN settings equal each other)."""
    found = members.config_difference(Scaled(a), Scaled(b), "craft")
    same = a == b or (a != a and b != b)
    assert (found is None) == same
    if not same:
        assert found == f"craft.scale is {b!r} there but {a!r} in the first member"


def test_config_difference_ignores_arrays_and_compares_functions_by_code() -> None:
    def adder(k):
        return lambda x: x + k

    assert members.config_difference({"w": np.zeros(2)}, {"w": np.ones(2)}, "m") is None
    assert members.config_difference(adder(1), adder(1), "f") is None
    found = members.config_difference(adder(1), adder(2), "f")
    assert "f (its closure)[0] is 2 there but 1" in str(found)
    assert members.config_difference(np.tanh, np.sin, "f") is not None


# -- torch --------------------------------------------------------------------------------


def _torch_pair():
    torch = pytest.importorskip("torch")
    from torch import nn

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Dropout(0.1), nn.Linear(4, 2))

    return make(), make()


@pytest.mark.parametrize("frozen_first", [False, True])
def test_torch_members_with_other_requires_grad_are_refused(frozen_first: bool) -> None:
    """The issue's example: a frozen member would train (or a trainable one never would)."""
    from dualtrain_torch import BatchModule

    a, b = _torch_pair()
    (a if frozen_first else b)[0].weight.requires_grad_(False)
    theirs, ours = (True, False) if frozen_first else (False, True)
    with pytest.raises(
        ArgumentError,
        match=rf"modules\[1\] must .*; 0\.weight has requires_grad={theirs} there but {ours}",
    ):
        BatchModule.from_modules([a, b])


@settings(max_examples=25, deadline=None)
@given(masks=st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=3))
def test_torch_requires_grad_law(masks: list[list[bool]]) -> None:
    """from_modules takes members iff every member freezes the same parameters; the batch
    then trains exactly the parameters each member trains."""
    from dualtrain_torch import BatchModule

    members_ = []
    for mask in masks:
        m, _ = _torch_pair()
        for p, trains in zip(m.parameters(), mask, strict=True):
            p.requires_grad_(trains)
        members_.append(m)
    if any(mask != masks[0] for mask in masks):
        with pytest.raises(ArgumentError, match=r"modules\[\d\] .* has requires_grad="):
            BatchModule.from_modules(members_, check_isolation=False)
        return
    bm = BatchModule.from_modules(members_, check_isolation=False)
    names = [n for n, _ in members_[0].named_parameters()]
    got = [bm.get_parameter(f"stack.{n}").requires_grad for n in names]
    assert got == masks[0]


def test_torch_frozen_in_every_member_is_taken() -> None:
    from dualtrain_torch import BatchModule

    a, b = _torch_pair()
    for m in (a, b):
        m[0].weight.requires_grad_(False)
    bm = BatchModule.from_modules([a, b])
    assert not bm.get_parameter("stack.0.weight").requires_grad


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda m: m.__setitem__(1, __import__("torch").nn.Tanh()),
            r"1 is a Tanh there but a ReLU",
        ),
        (lambda m: setattr(m[2], "p", 0.5), r"2\.p is 0\.5 there but 0\.1 in the first member"),
        (lambda m: m[2].eval(), r"2 is in eval mode there but in training mode"),
        (lambda m: m.register_forward_hook(lambda *a: None), r"1 forward hooks there"),
        (
            lambda m: m[3].register_buffer("extra", __import__("torch").zeros(1), False),
            r"lacks \[\] and has \['3\.extra'\]",
        ),
    ],
    ids=["class", "setting", "mode", "hook", "buffer"],
)
def test_torch_members_that_run_otherwise_are_refused(change: Any, message: str) -> None:
    from dualtrain_torch import BatchModule

    a, b = _torch_pair()
    change(b)
    before = [t.detach().clone() for t in b.parameters()]
    with pytest.raises(ArgumentError, match=rf"modules\[1\] must .*{message}"):
        BatchModule.from_modules([a, b])
    assert all(t.equal(u) for t, u in zip(b.parameters(), before, strict=True))


def test_torch_insert_refuses_another_requires_grad_and_setting() -> None:
    from dualtrain_torch import BatchModule

    a, b = _torch_pair()
    bm = BatchModule.from_modules([a, b])
    b[0].bias.requires_grad_(False)
    with pytest.raises(ArgumentError, match=r"module must .*0\.bias has requires_grad=False"):
        bm.insert(1, b)
    _, c = _torch_pair()
    c[2].p = 0.9
    with pytest.raises(ArgumentError, match=r"2\.p is 0\.9 there but 0\.1"):
        bm.insert(0, c)


def test_torch_same_method_hooks_and_submodule_modes_are_kept() -> None:
    """A method hook of each member's own module is the same hook; a submodule held in eval
    by the first member stays in eval in the batch (it was flipped to the whole's mode)."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from dualtrain_torch import BatchModule

    class Hooked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.bn = nn.Linear(3, 2), nn.BatchNorm1d(2)
            self.register_forward_hook(self.hook)

        def hook(self, module, inputs, output):
            return output * 2

        def forward(self, x):
            return self.bn(self.fc(x))

    members_ = [Hooked().double() for _ in range(2)]
    for m in members_:
        m.bn.eval()
    bm = BatchModule.from_modules(members_, check_isolation=False)
    assert bm.training and not bm._template.bn.training
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    with torch.no_grad():
        want = torch.stack([m(xi) for m, xi in zip(members_, x, strict=True)])
        torch.testing.assert_close(bm(x), want)


# -- JAX ----------------------------------------------------------------------------------


def test_jax_members_with_other_craft_settings_are_refused() -> None:
    pytest.importorskip("jax")
    import dualtrain_jax
    from dualtrain_jax.batching import BatchModule

    one = dualtrain_jax.realize(Scaled(1.0), seed=0)
    for other, message in [
        (Scaled(2.0), r"craft\.scale is 2\.0 there but 1\.0"),
        (Scaled(1.0, act="relu"), r"craft\.act is 'relu' there but 'tanh'"),
    ]:
        with pytest.raises(ArgumentError, match=rf"modules\[1\] must .*; {message}"):
            BatchModule.from_modules([one, dualtrain_jax.realize(other, seed=1)])
        bm = BatchModule.from_modules([one, dualtrain_jax.realize(Scaled(1.0), seed=1)])
        with pytest.raises(ArgumentError, match=rf"module must .*; {message}"):
            bm.insert(1, dualtrain_jax.realize(other, seed=1))


def test_jax_members_in_another_mode_are_refused() -> None:
    pytest.importorskip("jax")
    import dualtrain_jax
    from dualtrain_jax.batching import BatchModule

    one = dualtrain_jax.realize(Scaled(), seed=0)
    other = dualtrain_jax.realize(Scaled(), seed=1)
    one.train, other.train = True, False
    with pytest.raises(ArgumentError, match=r"modules\[1\] .* eval mode there but in training"):
        BatchModule.from_modules([one, other])
    other.train = True
    assert BatchModule.from_modules([one, other]).train


@pytest.mark.parametrize("shim", [False, True], ids=["native", "torchmb"])
def test_a_submodule_held_in_eval_stays_in_eval(shim: bool) -> None:
    """A BatchNorm in eval inside a training model ran in training mode in the batch (the
    constructor set every submodule to the model's mode): its running statistics were
    ignored and updated. Now the batch runs each submodule in the model's own mode."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from dualtrain_torch import BatchModule
    from dualtrain_torch.compat import torchmb

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double()
    with torch.no_grad():
        model[1].running_mean += 5.0
    model[1].eval()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    bm = torchmb.BatchModule(model, 2) if shim else BatchModule(model, 2, init="identical")
    with torch.no_grad():
        want = torch.stack([model(xi) for xi in x])
        torch.testing.assert_close(bm(x).reshape(want.shape), want)
    assert bm.training


# -- equal settings built separately are the same settings --------------------------------


def _leaky(slope: float = 0.1) -> Any:
    import functools

    from torch.nn import functional

    return functools.partial(functional.leaky_relu, negative_slope=slope)


def test_config_difference_compares_partials_by_parts_and_skips_opaque_objects() -> None:
    """A partial, a bound method or a builtin rebuilt per member used to differ by identity;
    an object with no settings and an identity-only == is not compared at all."""
    import functools
    import threading

    assert (
        members.config_difference(functools.partial(max, 1), functools.partial(max, 1), "f") is None
    )
    found = members.config_difference(
        functools.partial(round, ndigits=1), functools.partial(round, ndigits=2), "f"
    )
    assert found == "f.keywords['ndigits'] is 2 there but 1 in the first member"
    assert "f.func is" in str(
        members.config_difference(functools.partial(max, 1), functools.partial(min, 1), "f")
    )
    assert members.config_difference(Scaled(2.0).run, Scaled(2.0).run, "f") is None
    assert "f.__self__.scale is 3.0" in str(
        members.config_difference(Scaled(2.0).run, Scaled(3.0).run, "f")
    )
    assert members.config_difference([1, 2].index, [1, 2].index, "f") is None
    assert members.config_difference(threading.Lock(), threading.Lock(), "lock") is None
    # Two lambdas written apart are other code, even when they read the same.
    assert members.config_difference(lambda x, k=1: x + k, lambda x, k=1: x + k, "f") is not None
    make = [lambda k=k: lambda x, k=k: x + k for k in (1, 1, 2)]
    assert members.config_difference(make[0](), make[1](), "f") is None
    assert "f (its defaults)[0] is 2" in str(members.config_difference(make[0](), make[2](), "f"))


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm", "old_spectral_norm"])
def test_torch_parametrized_members_are_taken_and_match_their_models(kind: str) -> None:
    """parametrize gives every module its own generated class, so two weight-normed Linears
    were refused as "a ParametrizedLinear there but a ParametrizedLinear"."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from dualtrain_torch import BatchModule

    wrap: Any = {
        "weight_norm": nn.utils.parametrizations.weight_norm,
        "spectral_norm": nn.utils.parametrizations.spectral_norm,
        "old_spectral_norm": nn.utils.spectral_norm,
    }[kind]
    torch.manual_seed(0)
    members_ = [nn.Sequential(wrap(nn.Linear(3, 2)), nn.Tanh()).double().eval() for _ in range(3)]
    bm = BatchModule.from_modules(members_, check_isolation=False).eval()
    x = torch.randn(3, 4, 3, dtype=torch.float64)
    with torch.no_grad():
        want = torch.stack([m(xi) for m, xi in zip(members_, x, strict=True)])
        torch.testing.assert_close(bm(x), want)
    other = nn.Sequential(nn.Linear(3, 2), nn.Tanh()).double().eval()
    with pytest.raises(ArgumentError, match=r"modules\[1\] must "):
        BatchModule.from_modules([members_[0], other], check_isolation=False)


def test_torch_parametrized_members_with_other_parametrization_settings_are_refused() -> None:
    pytest.importorskip("torch")
    from torch import nn

    from dualtrain_torch import BatchModule

    sn = nn.utils.parametrizations.spectral_norm
    a, b = sn(nn.Linear(3, 2), eps=1e-12), sn(nn.Linear(3, 2), eps=1e-6)
    with pytest.raises(ArgumentError, match=r"parametrizations\.weight\.0\.eps is 1e-06 there"):
        BatchModule.from_modules([a, b], check_isolation=False)

    class Mine(nn.Linear):
        pass

    wn = nn.utils.parametrizations.weight_norm
    with pytest.raises(ArgumentError, match=r"Mine\) there but .*\(a parametrized Linear\)"):
        BatchModule.from_modules(
            [nn.Sequential(wn(nn.Linear(3, 2))), nn.Sequential(wn(Mine(3, 2)))],
            check_isolation=False,
        )


@pytest.mark.parametrize("slope", [0.1, 0.2])
def test_torch_partial_settings_are_equal_when_their_parts_are(slope: float) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    from dualtrain_torch import BatchModule

    class Act(nn.Linear):
        def forward(self, x):
            return self.act(super().forward(x))

    torch.manual_seed(0)
    members_ = [Act(3, 2).double() for _ in range(2)]
    members_[0].act, members_[1].act = _leaky(), _leaky(slope)
    if slope != 0.1:
        with pytest.raises(
            ArgumentError, match=r"act\.keywords\['negative_slope'\] is 0\.2 there but 0\.1"
        ):
            BatchModule.from_modules(members_, check_isolation=False)
        return
    bm = BatchModule.from_modules(members_, check_isolation=False)
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    with torch.no_grad():
        want = torch.stack([m(xi) for m, xi in zip(members_, x, strict=True)])
        torch.testing.assert_close(bm(x), want)


@pytest.mark.parametrize("same", [True, False])
def test_torch_separately_built_equal_closure_hooks_are_the_same_hook(same: bool) -> None:
    torch = pytest.importorskip("torch")

    from dualtrain_torch import BatchModule

    def scaler(k: float) -> Any:
        return lambda module, inputs, output: output * k

    a, b = _torch_pair()
    a.register_forward_hook(scaler(2.0))
    b.register_forward_hook(scaler(2.0 if same else 3.0))
    if not same:
        with pytest.raises(ArgumentError, match=r"forward hooks\[0\] \(its closure\)\[0\] is 3\.0"):
            BatchModule.from_modules([a, b], check_isolation=False)
        return
    bm = BatchModule.from_modules([a, b], check_isolation=False).eval()
    a.eval(), b.eval()
    x = torch.randn(2, 4, 3)
    with torch.no_grad():
        torch.testing.assert_close(bm(x), torch.stack([a(x[0]), b(x[1])]))


def test_jax_partial_craft_settings_are_equal_when_their_parts_are() -> None:
    pytest.importorskip("jax")
    import functools

    import dualtrain_jax
    from dualtrain_jax.batching import BatchModule

    def built(digits: int) -> Scaled:
        craft = Scaled(1.0)
        craft.rounding = functools.partial(round, ndigits=digits)
        return craft

    one = dualtrain_jax.realize(built(1), seed=0)
    assert BatchModule.from_modules([one, dualtrain_jax.realize(built(1), seed=1)]).batch == 2
    with pytest.raises(ArgumentError, match=r"craft\.rounding\.keywords\['ndigits'\] is 2"):
        BatchModule.from_modules([one, dualtrain_jax.realize(built(2), seed=1)])


@given(
    st.dictionaries(st.sampled_from("abc"), st.integers(-2, 2), max_size=3),
    st.dictionaries(st.sampled_from("abc"), st.integers(-2, 2), max_size=3),
)
def test_partials_differ_exactly_where_their_keywords_do(
    ours: dict[str, int], theirs: dict[str, int]
) -> None:
    """Two partials of one function built apart are one setting iff their keywords are
    equal (whatever order they were given in)."""
    import functools

    def f(**kw: int) -> dict[str, int]:
        return kw

    reordered = dict(reversed(list(theirs.items())))
    found = members.config_difference(
        functools.partial(f, **ours), functools.partial(f, **reordered), "act"
    )
    assert (found is None) == (ours == theirs)
    if found is not None:
        assert found.startswith("act.keywords")
