"""The BatchModule skeleton (`dualtrain.batching.skeleton`), tested on its own and in both adapters.

`MemberBatch` is driven here by a small framework written in NumPy (`NumpyHooks`: members
are dicts of arrays, a call is a record of its inputs): a real implementation of
`FrameworkHooks`, not a stand-in for torch or JAX. The adapters' own hooks satisfy the same
Protocol, and the same calls give the same errors and text under torch and JAX.
"""

from __future__ import annotations

import dataclasses
import pickle
import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

from dualtrain.batching import members
from dualtrain.batching.dispatch import Decision
from dualtrain.batching.skeleton import (
    ANY,
    BatchSettings,
    Framework,
    FrameworkHooks,
    MemberBatch,
)
from dualtrain.errors import ArgumentError, ShapeError

FRAMEWORK = Framework("numpy", "a non-empty list of Members", dict, "a dict")


@dataclasses.dataclass
class Call:
    """One call of the NumPy framework: its inputs, mode, and whether it is 'traced'."""

    inputs: tuple
    training: bool = True
    traced: bool = False
    device: str = "cpu"


class NumpyHooks:
    """`FrameworkHooks` for members that are ``{name: array}`` dicts (``"training"``: a bool).

    `choose` answers from `plans` (by the inputs' leading shapes; ``"auto"`` measures by
    taking the first plan) and records every call it gets, so a test can count them.
    """

    def __init__(self, settings: BatchSettings, first: dict, plans: dict | None = None) -> None:
        self.settings, self.entries = settings, _entries(first)
        self.plans = plans or {}
        self.chosen: list[tuple] = []
        self.adopted: list[tuple[str, bool]] = []

    def values(self, module, name):
        if not isinstance(module, dict):
            raise ArgumentError(f"{name} must be a dict; got {type(module).__name__}")
        members.compare_architectures(self.entries, _entries(module), name)
        return {k: np.asarray(v) for k, v in module.items() if k != "training"}

    def modes(self, module):
        return {"the module": bool(module.get("training", True))}

    def arrays(self, value):
        if isinstance(value, np.ndarray):
            return [("", value.shape)]
        if isinstance(value, dict):
            return [(f"[{k!r}]", v.shape) for k, v in value.items() if isinstance(v, np.ndarray)]
        return []

    def key(self, call):
        shapes = tuple(np.shape(x) for x in call.inputs)
        return ("numpy", shapes, ANY if call.traced else call.device, call.training)

    def choose(self, key, call):
        self.chosen.append(key)
        strategy = self.settings.strategy
        if call.traced and strategy == "auto":
            return Decision("vmap", None, "default")
        if strategy != "auto":
            return Decision(strategy)
        strategy = self.plans.get(key[1], "vmap")
        return Decision(strategy, None, "measured", {strategy: 0.001, "loop": 0.002})

    def adopt(self, decision, call, probe):
        self.adopted.append((decision.strategy, probe))
        if not probe or call.traced:
            return None
        return f"passed ({decision.strategy}, {'training' if call.training else 'eval'})"


def _entries(module: dict) -> list[members.Entry]:
    return [
        (k, tuple(np.shape(v)), np.asarray(v).dtype.name, True)
        for k, v in module.items()
        if k != "training"
    ]


def _member(width: int = 3, training: bool = True, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((width, 2)), "b": np.zeros(width), "training": training}


def _batch(
    batch: int = 2,
    *,
    strategy: str = "auto",
    shared_input: bool = False,
    check_isolation: bool = True,
    plans: dict | None = None,
) -> MemberBatch[NumpyHooks]:
    # Built as is: `Framework.settings` checks strategies against torch's or JAX's names.
    s = BatchSettings(
        batch, "identical", [0] * batch, shared_input, strategy, None, check_isolation
    )
    return MemberBatch(FRAMEWORK, s, NumpyHooks(s, _member(), plans), "Member")


def test_the_numpy_hooks_and_both_adapters_hooks_satisfy_the_protocol():
    assert isinstance(_batch().hooks, FrameworkHooks)
    assert not isinstance(object(), FrameworkHooks)
    torch_bm, jax_bm = _torch_bm(), _jax_bm()
    assert isinstance(torch_bm._core.hooks, FrameworkHooks)
    assert isinstance(jax_bm._core.hooks, FrameworkHooks)
    assert isinstance(torch_bm._core, MemberBatch) and isinstance(jax_bm._core, MemberBatch)


def test_settings_are_checked_in_the_documented_order_with_the_house_messages():
    ok = {
        "init": "independent",
        "seed": 0,
        "shared_input": False,
        "strategy": "auto",
        "memory_budget": None,
        "check_isolation": True,
    }
    torch_framework = Framework("torch", "x")
    s = torch_framework.settings(3, **ok)
    assert s == BatchSettings(
        3, "independent", members.member_seeds(0, 3), False, "auto", None, True
    )
    for bad, match in [
        ({"init": "zeros", "strategy": "fast"}, "init must be one of"),
        ({"shared_input": 1, "strategy": "fast"}, "shared_input must be a bool"),
        ({"strategy": "fast", "memory_budget": 0}, "strategy must be one of"),
        ({"memory_budget": 0, "check_isolation": "yes"}, "memory_budget must be"),
        ({"check_isolation": "yes"}, "check_isolation must be a bool"),
        ({"seed": -1}, "seed must be an int"),
    ]:
        with pytest.raises(ArgumentError, match=match):
            torch_framework.settings(3, **(ok | bad))
    with pytest.raises(ArgumentError, match="batch must be a positive int; got batch=0"):
        torch_framework.settings(0, **(ok | {"init": "zeros"}))


@given(batch=st.integers(1, 50), index=st.integers(-(2**70), 2**70))
def test_an_index_is_a_member_in_range_or_refused_naming_the_range(batch, index):
    core = _batch(batch)
    if -batch <= index < batch:
        assert core.index(index) == index % batch
        row, values = core.member(index, _member())
        assert row == index % batch and set(values) == {"w", "b"}
    else:
        message = f"index must be an int in [{-batch}, {batch - 1}]; got index={index}"
        with pytest.raises(ArgumentError, match=re.escape(message)):
            core.index(index)
        with pytest.raises(ArgumentError, match=re.escape(message)):
            core.member(index, _member())


@pytest.mark.parametrize("index", [True, 1.0, "0", None])
def test_an_index_that_is_not_an_int_is_refused(index):
    with pytest.raises(ArgumentError, match="index must be an int"):
        _batch(2).index(index)


def test_a_module_list_is_a_non_empty_sequence_of_the_framework_class():
    listed = [_member(), _member(seed=1)]
    assert FRAMEWORK.module_list(listed) is listed
    for bad in ([], None, 3, _member()):
        with pytest.raises(ArgumentError, match="modules must be a non-empty list of Members"):
            FRAMEWORK.module_list(bad)
    with pytest.raises(ArgumentError, match=r"modules\[1\] must be a dict"):
        FRAMEWORK.module_list([_member(), "x"])
    untyped = Framework("numpy", "a non-empty list of modules")
    assert untyped.module_list(["anything"]) == ["anything"]


def test_admit_names_the_first_bad_member_and_checks_every_one_before_any_is_written():
    core = _batch(3)
    rows = core.admit([_member(), _member(seed=1), _member(seed=2)])
    assert [i for i, _ in rows] == [1, 2]
    np.testing.assert_array_equal(rows[0][1]["w"], _member(seed=1)["w"])
    with pytest.raises(ArgumentError, match=r"modules\[2\] must have the first member's arch"):
        core.admit([_member(), _member(), _member(width=4)])
    with pytest.raises(
        ArgumentError,
        match=r"modules\[1\] must have the first member's architecture; the module is in eval "
        "mode there but in training mode in the first member",
    ):
        core.admit([_member(), _member(training=False), _member(width=4)])
    # an architecture error of a member comes before its mode's
    with pytest.raises(ArgumentError, match=r"w is a float64 parameter of shape \(4, 2\) there"):
        core.admit([_member(), {**_member(width=4), "training": False}])


def test_inputs_need_the_member_count_first_unless_shared():
    core = _batch(2)
    with pytest.raises(ArgumentError, match="BatchModule needs at least one input; got none"):
        core.check_inputs(())
    core.check_inputs((np.zeros((2, 5, 3)), {"m": np.zeros((2, 1))}, 7))
    message = (
        "inputs[1]['m'] must have the member count as its leading dimension, [batch, B, ...] "
        "with batch=2; got inputs[1]['m'] of shape (3, 1)"
    )
    with pytest.raises(ShapeError, match=re.escape(message)):
        core.check_inputs((np.zeros((2, 5)), {"m": np.zeros((3, 1))}))
    _batch(2, shared_input=True).check_inputs((np.zeros((5, 3)),))


def test_a_decision_is_chosen_once_per_key_and_probed_once_per_strategy_and_mode():
    core = _batch(2, plans={((2, 4),): "loop"})
    hooks = core.hooks
    first = core.decide(Call((np.zeros((2, 4)),)), True)
    assert first.strategy == "loop" and core.decision is first
    assert core.isolation == "passed (loop, training)"
    assert core.decide(Call((np.zeros((2, 4)),)), True) is first
    assert len(hooks.chosen) == 1 and hooks.adopted == [("loop", True)]
    # Another key, same strategy and mode: chosen, not probed again.
    core.decide(Call((np.zeros((2, 4)),), device="other"), True)
    assert len(hooks.chosen) == 2 and hooks.adopted[-1] == ("loop", False)
    # Eval: another key and another mode, so probed again; its verdict is the one in use.
    core.decide(Call((np.zeros((2, 4)),), training=False), False)
    assert hooks.adopted[-1] == ("loop", True) and core.isolation == "passed (loop, eval)"
    # Back to a known training key: its strategy's training verdict again.
    core.decide(Call((np.zeros((2, 4)),)), True)
    assert core.isolation == "passed (loop, training)" and len(hooks.chosen) == 3


def test_no_probe_without_check_isolation_and_a_default_decision_is_not_kept():
    core = _batch(2, check_isolation=False)
    traced = Call((np.zeros((2, 4)),), traced=True)
    assert core.decide(traced, True).reason == "default"
    assert core.decision is None and core.isolation is None
    core.decide(traced, True)
    assert len(core.hooks.chosen) == 2 and core.hooks.adopted == []  # chosen again, not kept
    core.decide(Call((np.zeros((2, 4)),)), True)
    assert core.hooks.adopted == [("vmap", False)] and core.isolation is None


def test_a_key_with_an_unknown_field_takes_the_first_kept_decision_whatever_that_field():
    core = _batch(2, plans={((2, 4),): "loop"})
    core.decide(Call((np.zeros((2, 4)),), device="gpu:0"), True)
    core.hooks.plans = {((2, 4),): "vmap"}
    core.decide(Call((np.zeros((2, 4)),), device="gpu:1"), True)
    chosen = len(core.hooks.chosen)
    assert core.decide(Call((np.zeros((2, 4)),), traced=True), True).strategy == "loop"
    assert len(core.hooks.chosen) == chosen
    # Other shapes under a trace: nothing kept fits.
    assert core.decide(Call((np.zeros((2, 5)),), traced=True), True).reason == "default"


def test_a_kept_traced_key_does_not_answer_a_call_whose_field_is_known():
    core = _batch(2, strategy="map")
    core.decide(Call((np.zeros((2, 4)),), traced=True), True)  # forced: kept with ANY
    core.decide(Call((np.zeros((2, 4)),)), True)
    assert len(core.hooks.chosen) == 2


@given(
    calls=st.lists(
        st.tuples(st.integers(3, 5), st.sampled_from(["a", "b"]), st.booleans()),
        min_size=1,
        max_size=12,
    )
)
def test_choose_runs_once_per_distinct_key_and_the_probe_once_per_strategy_and_mode(calls):
    core = _batch(2, plans={((2, 3),): "loop", ((2, 4),): "vmap", ((2, 5),): "loop"})
    for width, device, training in calls:
        decision = core.decide(Call((np.zeros((2, width)),), training, device=device), training)
        assert core.decision is decision
        assert core.isolation == f"passed ({decision.strategy}, {_mode(training)})"
    keys = {(w, d, t) for w, d, t in calls}
    assert len(core.hooks.chosen) == len(keys)
    probed = [(s, p) for s, p in core.hooks.adopted if p]
    expected = {(core.hooks.plans[((2, w),)], t) for w, _, t in calls}
    assert len(probed) == len(expected)


def _mode(training: bool) -> str:
    return "training" if training else "eval"


def test_explain_says_not_chosen_then_the_decision_and_its_notes_replace_the_table():
    core = _batch(3)
    assert core.explain() == (
        "BatchModule (numpy, 3 members)\n"
        "  strategy: not chosen yet; the first call chooses it\n"
        "  isolation probe: not run yet (runs on the first call)"
    )
    text = core.tune(Call((np.zeros((3, 4)),)), True)
    assert text == core.explain()
    assert text.splitlines() == [
        "BatchModule (numpy, 3 members)",
        "  strategy: vmap (measured)",
        "    vmap          1.000 ms per call  <- chosen",
        "    loop          2.000 ms per call",
        "  isolation probe: passed (vmap, training)",
    ]
    core.decision = dataclasses.replace(core.decision, notes=("one note", "two notes"))
    assert core.explain().splitlines() == [
        "BatchModule (numpy, 3 members)",
        "  strategy: vmap (measured)",
        "    one note",
        "    two notes",
        "  isolation probe: passed (vmap, training)",
    ]


def test_summary_and_repr_name_the_batch_the_kind_and_the_strategy():
    core = _batch(4)
    assert core.summary() == "batch=4, module=Member, strategy='auto'"
    assert repr(core) == "MemberBatch(numpy, batch=4, module=Member, strategy='auto')"
    assert core.batch == 4 and core.strategy == "auto" and core.shared_input is False


def test_the_skeletons_settings_read_its_own_and_are_read_only():
    core = _batch(4)
    core.settings.strategy = "vmap"
    assert core.strategy == "vmap"  # the one value, read where it lives
    with pytest.raises(AttributeError, match="'batch' of 'MemberBatch' object has no setter"):
        core.batch = 2
    assert "`decision` names the one in use" in type(core).strategy.__doc__


def test_the_skeleton_pickles_with_its_decisions_and_wildcard_keys():
    core = _batch(2, strategy="map")
    core.decide(Call((np.zeros((2, 4)),), traced=True), True)
    copy = pickle.loads(pickle.dumps(core))
    assert copy.decide(Call((np.zeros((2, 4)),), traced=True), True) == core.decision
    assert copy.hooks.chosen == core.hooks.chosen  # found, not chosen again
    assert repr(ANY) == "ANY"


# -- both adapters: the same calls, the same errors and text ---------------------------------


def _recipe(features: int = 3):
    """Another `features` changes one tensor alone (``first.weight``): both adapters name it."""
    from tests.batching.builders import Recipe, RecipeNet

    return RecipeNet(Recipe("mlp", features, 3, 2, norm=False, dropout=False))


def _torch_bm(**kwargs):
    torch = pytest.importorskip("torch")
    del torch
    import dualtrain_torch

    return dualtrain_torch.BatchModule(dualtrain_torch.realize(_recipe()), 2, **kwargs)


def _jax_bm(**kwargs):
    pytest.importorskip("jax")
    import dualtrain_jax

    return dualtrain_jax.BatchModule(dualtrain_jax.realize(_recipe()), 2, **kwargs)


def _outcome(fn):
    try:
        fn()
    except Exception as error:  # the message is what is compared
        return type(error).__name__, str(error)
    return None


def _sequence(backend: str) -> list:
    """The same calls under `backend`: errors and texts, with the backend's name masked."""
    if backend == "torch":
        torch = pytest.importorskip("torch")
        import dualtrain_torch as adapter

        def inputs(shape):
            return torch.zeros(shape)

        def mode(m, training):
            return m.train(training)
    else:
        pytest.importorskip("jax")
        import jax.numpy as jnp

        import dualtrain_jax as adapter

        def inputs(shape):
            return jnp.zeros(shape)

        def mode(m, training):
            m.train = training
            return m

    bm_class = adapter.BatchModule

    def member(seed, features=3, training=True):
        return mode(adapter.realize(_recipe(features), seed=seed), training)

    one, other = member(1), member(2, features=4)
    out = [
        _outcome(lambda: bm_class.from_modules([])),
        _outcome(lambda: bm_class.from_modules([one, other])),
        _outcome(lambda: bm_class.from_modules([one, member(3), other])),
        _outcome(lambda: bm_class.from_modules([one, member(4, training=False)])),
    ]
    bm = bm_class.from_modules([one, member(5)], strategy="vmap", check_isolation=False)
    out += [
        _outcome(lambda: bm.extract(2)),
        _outcome(lambda: bm.extract(-3)),
        _outcome(lambda: bm.insert(2, one)),
        _outcome(lambda: bm.insert(0, other)),
        _outcome(lambda: bm()),
        _outcome(lambda: bm(inputs((3, 4, 3)))),
        bm.extra_repr() if backend == "torch" else repr(bm).removeprefix("BatchModule(")[:-1],
        bm.explain(),
    ]
    bm(inputs((2, 4, 3)))
    out += [bm.explain(), bm.tune(inputs((2, 4, 3)))]

    def mask(o):
        if isinstance(o, tuple):
            return tuple(mask(part) for part in o)
        return o.replace(backend, "<backend>") if isinstance(o, str) else o

    return [mask(o) for o in out]


def test_the_same_calls_give_the_same_errors_and_text_under_torch_and_jax():
    torch_side, jax_side = _sequence("torch"), _sequence("jax")
    # from_modules([]) names what each framework takes ("nn.Modules", "modules")
    assert torch_side[0][1].startswith("modules must be a non-empty list of nn.Modules")
    assert jax_side[0][1].startswith("modules must be a non-empty list of modules")
    assert torch_side[1:] == jax_side[1:]
    assert all(o is not None for o in torch_side)
    assert "modules[1] must have the first member's architecture" in torch_side[1][1]
    assert "modules[2] must have the first member's architecture" in torch_side[2][1]
    assert "the module is in eval mode there but in training mode" in torch_side[3][1]
    assert torch_side[4] == ("ArgumentError", "index must be an int in [-2, 1]; got index=2")
    assert torch_side[-4] == "batch=2, module=RecipeNet (a realized Craft), strategy='vmap'"
    assert torch_side[-3].splitlines()[:2] == [
        "BatchModule (<backend>, 2 members)",
        "  strategy: not chosen yet; the first call chooses it",
    ]
    assert (
        torch_side[-2]
        == torch_side[-1]
        == (
            "BatchModule (<backend>, 2 members)\n"
            "  strategy: vmap (forced)\n"
            "  isolation probe: not run yet (runs on the first call)"
        )
    )


def test_jit_of_a_function_of_a_jax_batch_module_traces_once_per_module():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    traces = []

    @jax.jit
    def run(m, x):
        traces.append(1)
        return m(x)

    bm = _jax_bm(strategy="vmap", check_isolation=False)
    x = jnp.ones((2, 4, 3))
    first = run(bm, x)
    run(bm, x + 1)
    bm.insert(0, bm.extract(1))  # new arrays, the same aux data
    run(bm, x)
    run(bm.replace(params=bm.params), x)
    leaves, treedef = jax.tree_util.tree_flatten(bm)
    run(jax.tree_util.tree_unflatten(treedef, leaves), x)
    assert len(traces) == 1
    np.testing.assert_allclose(run(bm, x), bm(x), rtol=1e-6)
    assert first.shape == (2, 4, 2)
    run(_jax_bm(strategy="vmap", check_isolation=False), x)  # another module: its own trace
    assert len(traces) == 2
