"""The craft folder's layout: no import circles, small modules, every public name kept.

Issue 12 item 5: the dock specs carry their own input checks (``check_input``), so the
binding no longer reaches back through a checks module to the specs, and the NumPy ops
table sits apart from the reference that imports the specs.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import dualtrain
from dualtrain.craft import Craft, checks, dock, numpy_ops, reference, reference_forward
from dualtrain.errors import DtypeError, OutOfRangeError, ShapeError

grimp = pytest.importorskip("grimp")  # import-linter's graph; the test extra installs it

CRAFT = pathlib.Path(dualtrain.__file__).parent / "craft"

# The names `dualtrain.craft.dock` held before its specs moved to `dualtrain.craft.specs`.
DOCK_NAMES = (
    "AvgPool", "BatchNorm", "Conv", "ConvTranspose", "Dense", "Dropout", "Embedding",
    "Flatten", "GlobalAvgPool", "GlobalMaxPool", "Layer", "LayerNorm", "MaxPool", "Native",
    "Reshape", "Sequential", "accuracy", "add", "concat", "cross_entropy", "gelu", "log_softmax",
    "matmul", "mean", "pad", "relu", "sigmoid", "softmax", "tanh",
)  # fmt: skip


def test_no_module_of_the_craft_folder_imports_itself_back():
    graph = grimp.build_graph("dualtrain", exclude_type_checking_imports=True, cache_dir=None)
    craft = sorted(m for m in graph.modules if m.startswith("dualtrain.craft"))
    circles = [
        f"{module} -> {imported}"
        for module in craft
        for imported in graph.find_modules_directly_imported_by(module)
        if imported != module and graph.chain_exists(imported, module)
    ]
    assert circles == []


def test_craft_modules_stay_under_400_lines():
    sizes = {
        str(path.relative_to(CRAFT)): len(path.read_text().splitlines())
        for path in CRAFT.rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n >= 400} == {}


def test_dock_keeps_every_public_name():
    assert sorted(DOCK_NAMES) == sorted(dock.__all__)
    for name in DOCK_NAMES:
        assert getattr(dock, name) is getattr(dualtrain.dock, name)
    assert dualtrain.dock is dock
    assert reference.OPS is numpy_ops.OPS


class One(Craft):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def run(self, x):
        return self.layer(x)


@pytest.mark.parametrize(
    ("layer", "x", "error", "message"),
    [
        (dock.Dense(3, 2), np.ones((2, 4)), ShapeError, r"Dense takes \(\.\.\., 3\)"),
        (dock.Conv(3, 1, 3), np.ones((1, 4, 5, 5)), ShapeError, "Conv takes 3 channels"),
        (dock.MaxPool(3), np.ones((1, 1, 2, 2)), ShapeError, "MaxPool gives no output"),
        (dock.Embedding(5, 2), np.ones(2), DtypeError, "Embedding takes integer ids"),
        (dock.Embedding(5, 2), np.array([0, 5]), OutOfRangeError, "holds id 5 at position"),
    ],
)
def test_spec_check_and_the_old_check_function_refuse_as_running_does(layer, x, error, message):
    with pytest.raises(error, match=message):
        layer.check_input(x)
    with pytest.raises(error, match=message):
        checks.check(layer, x)  # the function the adapters called before, still there
    craft = One(layer)
    with pytest.raises(error, match=message):
        reference_forward(craft, craft.init(0, "float64"), x)
