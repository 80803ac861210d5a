"""Every module path and name torchmb's tests and README import, under the compat namespace.

Migrating is changing ``torchmb`` to ``dualtrain_torch.compat.torchmb`` in the imports: each
name below resolves there and works, or (for the few whose job dualtrain does another way)
raises `MovedNameError` naming that way. Bad arguments are refused with the argument, the
value and what was expected.
"""

from __future__ import annotations

import copy
import importlib
import typing

import pytest
import torch
from torch import nn

from dualtrain.errors import ArgumentError, DualtrainError, ShapeError
from dualtrain_torch.compat import torchmb
from dualtrain_torch.compat.torchmb.adapters import AbstractBatchAdapter
from dualtrain_torch.compat.torchmb.base import AbstractBatchModule
from dualtrain_torch.compat.torchmb.batch import BatchModule
from dualtrain_torch.compat.torchmb.layers import (
    BatchBatchNorm2d,
    BatchConv2d,
    BatchGroupNorm,
    BatchLinear,
)
from dualtrain_torch.compat.torchmb.tests import test_batched_model, test_model_batching
from dualtrain_torch.compat.torchmb.types import DataOrder
from dualtrain_torch.compat.torchmb.utils import (
    register_batch_module,
    to_batch_func,
    to_batch_module,
)

# torchmb's modules and the names its package, its tests and its README import from them.
IMPORTED = {
    "": [
        "AbstractBatchModule",
        "BatchModule",
        "merge_batch",
        "split_batch",
        "inner_batch_size",
        "batch_loss",
        "batch_accuracy",
        "BatchLinear",
        "BatchConv2d",
        "BatchBatchNorm2d",
        "BatchGroupNorm",
        "register_batch_module",
        "test_model_batching",
        "test_batched_model",
        "batch_topk",  # the README's name
        "register_module",  # the README's prose
    ],
    "base": ["AbstractBatchModule"],
    "batch": ["AbstractBatchModule", "BatchModule", "merge_batch", "split_batch"],
    "functional": [
        "batch_accuracy",
        "batch_loss",
        "inner_batch_size",
        "merge_batch",
        "split_batch",
    ],
    "layers": ["BatchLinear", "BatchConv2d", "BatchBatchNorm2d", "BatchGroupNorm"],
    "utils": ["register_batch_module", "to_batch_func", "to_batch_module", "BATCH_MODULES"],
    "tests": ["assert_all_close", "test_batched_model", "test_model_batching"],
    "types": [
        "StateDict",
        "DataOrder",
        "ForwardFunc",
        "Tensors",
        "TensorOrTensors",
        "Size",
        "IntOrInts",
    ],
    "adapters": ["AbstractBatchAdapter"],
}
MOVED = {
    "types": [
        "ELEMENTWISE_FUNCS",
        "BATCH_INDEPENDENT_FUNCS",
        "PARAMETER_FREE_ELEMENTWISE_MODULES",
        "BATCH_DEPENDENT_MODULES",
    ],
    "batch": ["BatcherTracer"],
}


def _module(path):
    return importlib.import_module("dualtrain_torch.compat.torchmb" + (f".{path}" if path else ""))


@pytest.mark.parametrize("path", list(IMPORTED))
def test_every_module_path_and_name_resolves(path):
    module = _module(path)
    for name in IMPORTED[path]:
        assert getattr(module, name) is not None, f"{module.__name__}.{name}"


def test_one_object_behind_each_name_wherever_it_is_imported_from():
    for path, names in IMPORTED.items():
        for name in names:
            if hasattr(torchmb, name):
                assert getattr(_module(path), name) is getattr(torchmb, name), (path, name)
    assert torchmb.batch_topk is torchmb.batch_accuracy
    assert torchmb.register_module is torchmb.register_batch_module
    assert set(typing.get_args(DataOrder)) == set(torchmb.functional.DATA_ORDERS)


@pytest.mark.parametrize(("path", "name"), [(p, n) for p, ns in MOVED.items() for n in ns])
def test_names_whose_job_is_done_another_way_say_which(path, name):
    with pytest.raises(torchmb.MovedNameError, match=r"torch\.func|BatchModule") as caught:
        exec(f"from dualtrain_torch.compat.torchmb.{path} import {name}", {})
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, DualtrainError)
    assert name in str(caught.value)
    with pytest.raises(torchmb.MovedNameError):
        getattr(_module(path), name)
    with pytest.raises(AttributeError):
        _module(path).no_such_name  # noqa: B018


def test_the_helpers_named_like_tests_are_not_collected_as_tests():
    assert test_batched_model.__test__ is False
    assert test_model_batching.__test__ is False


def test_subclassing_batch_module_to_hook_torchmbs_rewrite_is_refused():
    with pytest.raises(ArgumentError, match=r"overrides \['to_batch_module'\].*register_batch"):

        class Custom(BatchModule):
            def to_batch_module(self, node, module, batch):
                return module

    class Plain(BatchModule):  # a subclass that hooks nothing is fine
        pass

    assert Plain(nn.Linear(2, 2), 2)(torch.randn(2, 3, 2)).shape == (2, 3, 2)


def test_batch_module_helpers_delegate_to_utils():
    bm = BatchModule(nn.Linear(2, 2), 2)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(bm.to_batch_func(torch.tanh, 2)(x), torch.tanh(x))
    register_batch_module(BatchLinear)
    try:
        made = bm.to_batch_module(None, nn.Linear(2, 3), 4)
        assert isinstance(made, BatchLinear) and made.weight.shape == (4, 3, 2)
    finally:
        torchmb.BATCH_MODULES.pop(nn.Linear)


def test_to_batch_module_gives_the_registered_layer_and_names_the_way_otherwise():
    register_batch_module(BatchGroupNorm)
    try:
        gn = nn.GroupNorm(2, 4)
        made = to_batch_module(None, gn, 3)
        assert isinstance(made, BatchGroupNorm) and made.weight.shape == (3, 4)
    finally:
        torchmb.BATCH_MODULES.pop(nn.GroupNorm)
    with pytest.raises(ArgumentError, match=r"Tanh.*BatchModule\(module, 3\)"):
        to_batch_module(None, nn.Tanh(), 3)
    with pytest.raises(ArgumentError, match=r"module must be a torch nn\.Module"):
        to_batch_module(None, "tanh", 3)


def test_layers_are_not_registered_on_import_and_register_as_a_checked_fast_path():
    assert not {nn.Linear, nn.Conv2d, nn.BatchNorm2d, nn.GroupNorm} & set(torchmb.BATCH_MODULES)
    register_batch_module(BatchBatchNorm2d)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU())
        bm = BatchModule(model, 2)
        x = torch.randn(2, 3, 1, 5, 5)
        out = bm(x)
        assert "BatchBatchNorm2d (registered for BatchNorm2d, at child '1')" in bm.explain()
        for state in bm.state_dicts():
            single = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU())
            single.load_state_dict(state)
            assert int(state["1.num_batches_tracked"]) == 1
        torch.testing.assert_close(out[1], model(x[1]), rtol=1e-5, atol=1e-5)
    finally:
        torchmb.BATCH_MODULES.pop(nn.BatchNorm2d)


def test_abstract_batch_adapter_is_a_base_to_subclass():
    with pytest.raises(NotImplementedError, match="AbstractBatchAdapter must define forward"):
        AbstractBatchAdapter(2)(torch.zeros(4, 1))

    class Double(AbstractBatchAdapter):
        def forward(self, x):
            return 2 * x

    assert Double(2).batch == 2 and isinstance(Double(2), AbstractBatchModule)
    torch.testing.assert_close(Double(2)(torch.ones(4, 1)), torch.full((4, 1), 2.0))


# -- the layers: what torch's layers accept, and what torchmb got wrong ------------------


def test_layer_options_torchmb_dropped_work_as_in_torch():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 5)
    for conv in [
        nn.Conv2d(4, 6, 3, padding="same", padding_mode="circular"),
        nn.Conv2d(4, 6, 3, padding=(1, 2), padding_mode="replicate", groups=2, bias=False),
        nn.Conv2d(4, 2, (2, 3), stride=2, dilation=(1, 2), padding="valid"),
    ]:
        batched = BatchConv2d.from_module(conv, 2)
        got = torchmb.split_batch(batched(torchmb.merge_batch(x)), 2)
        torch.testing.assert_close(got, torch.stack([conv(xi) for xi in x]))
    linear = nn.Linear(5, 3, bias=False)
    assert BatchLinear.from_module(linear, 2).bias is None
    got = torchmb.split_batch(BatchLinear.from_module(linear, 2)(torchmb.merge_batch(x)), 2)
    torch.testing.assert_close(got, linear(x))
    wide = BatchLinear(7, 3, batch=4)
    assert not torch.equal(wide.weight[0], wide.weight[1])  # drawn per member, not garbage


def test_norm_options_match_torch_bit_for_bit():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 2, 3, 3)
    for bn in [
        nn.BatchNorm2d(2, momentum=None),
        nn.BatchNorm2d(2, affine=False, track_running_stats=False),
        nn.BatchNorm2d(2, eps=1e-3, momentum=0.3),
    ]:
        separate = [copy.deepcopy(bn) for _ in range(3)]
        batched = BatchBatchNorm2d.from_module(bn, 3)
        if bn.track_running_stats:
            # Members at different counts: momentum=None averages each over its own count.
            for i, m in enumerate(separate):
                m.num_batches_tracked.fill_(i)
            batched.num_batches_tracked.copy_(torch.arange(3))
        for mode in (True, True, False):
            for m in [*separate, batched]:
                m.train(mode)
            got = torchmb.split_batch(batched(torchmb.merge_batch(x)), 3)
            assert torch.equal(got, torch.stack([m(xi) for m, xi in zip(separate, x, strict=True)]))
        for state, m in zip(batched.state_dicts(), separate, strict=True):
            for k, v in m.state_dict().items():
                assert torch.equal(state[k], v), k
    gn = nn.GroupNorm(3, 6, affine=False)
    seq = torch.randn(3, 2, 6, 5)  # [G, B, C, L]: GroupNorm takes any rank
    got = torchmb.split_batch(BatchGroupNorm.from_module(gn, 3)(torchmb.merge_batch(seq)), 3)
    assert torch.equal(got, torch.stack([gn(s) for s in seq]))


def test_from_module_keeps_the_modules_dtype():
    bn = nn.BatchNorm2d(3).double()
    batched = BatchBatchNorm2d.from_module(bn, 2)
    assert batched.weight.dtype == torch.float64 and batched.num_batches_tracked.dtype == torch.long
    assert BatchLinear.from_module(nn.Linear(2, 2).double(), 2).weight.dtype == torch.float64


# -- bad arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: BatchLinear(3, 2, True, 0), ArgumentError, "batch must be a positive int"),
        (lambda: BatchLinear(-1, 2), ArgumentError, "in_features must be a non-negative int"),
        (
            lambda: BatchLinear(3, 2, "yes"),  # type: ignore[arg-type]
            ArgumentError,
            "bias must be a bool; got bias='yes'",
        ),
        (
            lambda: BatchConv2d(3, 4, 3, groups=2),
            ArgumentError,
            "in_channels must be a multiple of groups=2; got in_channels=3",
        ),
        (
            lambda: BatchConv2d(4, 4, 3, stride=2, padding="same"),
            ArgumentError,
            "must make an nn.Conv2d: .*strided",
        ),
        (
            lambda: BatchConv2d(4, 4, 3, padding_mode="mirror"),
            ArgumentError,
            "must make an nn.Conv2d",
        ),
        (
            lambda: BatchGroupNorm(4, 6),
            ArgumentError,
            "num_channels must be a multiple of num_groups=4; got num_channels=6",
        ),
        (
            lambda: BatchBatchNorm2d(3, momentum=2.0),
            ArgumentError,
            r"momentum must be a number in \[0, 1\], or None; got momentum=2.0",
        ),
        (lambda: BatchBatchNorm2d(3, eps=-1.0), ArgumentError, "eps must be a finite number"),
        (
            lambda: BatchLinear.from_module(nn.Conv2d(1, 1, 1), 2),
            ArgumentError,
            "module must be an nn.Linear",
        ),
        (
            lambda: BatchLinear(3, 2, batch=2)(torch.randn(4, 5)),
            ShapeError,
            r"\[\(B\*batch\), \.\.\., in\] with in=3; got shape \(4, 5\)",
        ),
        (
            lambda: BatchLinear(3, 2, batch=2)(torch.randn(5, 3)),
            ShapeError,
            "multiple of batch=2",
        ),
        (
            lambda: BatchConv2d(3, 2, 1, batch=2)(torch.randn(4, 3, 5)),
            ShapeError,
            r"BatchConv2d takes merged rows \[\(B\*batch\), C, H, W\] with C=3",
        ),
        (
            lambda: BatchBatchNorm2d(3, batch=2)(torch.randn(4, 2, 5, 5)),
            ShapeError,
            "with C=3; got shape",
        ),
        (lambda: BatchGroupNorm(1, 3, batch=2)([1.0]), ArgumentError, "x must be a tensor"),
        (
            lambda: to_batch_func(3, 2),  # type: ignore[arg-type]
            ArgumentError,
            "node must be a function",
        ),
        (lambda: to_batch_func(nn.ReLU(), 2), ArgumentError, "node must be a function"),
        (
            lambda: to_batch_func(torch.relu, 2, "gb"),  # type: ignore[arg-type]
            ArgumentError,
            "data_order must be one of",
        ),
        (lambda: to_batch_func(torch.relu, 0), ArgumentError, "batch must be a positive int"),
        (
            lambda: to_batch_func(torch.relu, 2)(3.0),
            ArgumentError,
            "batch_relu needs at least one tensor argument",
        ),
        (
            lambda: to_batch_func(torch.relu, 2)(torch.zeros(3, 4)),
            ShapeError,
            r"\[G, B, \.\.\.\] with G=batch=2",
        ),
        (
            lambda: test_batched_model(nn.Linear(2, 2), nn.Linear(2, 2), [(3, 2)]),  # type: ignore[arg-type]
            ArgumentError,
            "batched_model must be an AbstractBatchModule",
        ),
        (
            lambda: test_model_batching(nn.Linear(2, 2), (3, 2)),  # type: ignore[arg-type]
            ArgumentError,
            r"input_shapes must be a sequence of input shapes, one per input",
        ),
        (
            lambda: test_model_batching(nn.Linear(2, 2), [(3, 2)], rtol=-1.0),
            ArgumentError,
            "rtol must be a finite number >= 0",
        ),
    ],
)
def test_bad_arguments_are_refused_naming_them(call, error, match):
    with pytest.raises(error, match=match):
        call()
