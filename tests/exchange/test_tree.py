import collections
import dataclasses

import pytest
from hypothesis import given

from dualtrain import ArgumentError, convert
from dualtrain.tree import Field, format_path, leaves, map_with_path
from tests.strategies import Pair, Record, pytrees


def _same_structure(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same_structure(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same_structure(x, y)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same_structure(getattr(a, f.name), getattr(b, f.name))


@given(tree=pytrees())
def test_identity_map_rebuilds_the_same_containers(tree):
    _same_structure(tree, map_with_path(lambda _, x: x, tree))


@given(tree=pytrees())
def test_map_visits_each_leaf_once_in_leaves_order(tree):
    seen = []
    out = map_with_path(lambda path, x: seen.append(path) or len(seen), tree)
    assert leaves(out) == list(range(1, len(seen) + 1))
    assert len(set(seen)) == len(seen)


def test_paths_name_keys_indices_and_fields():
    tree = {"a": [1, Record(weights=2, label=(3,))], "b": Pair(4, 5)}
    paths = []
    map_with_path(lambda p, x: paths.append(format_path(p)), tree)
    assert paths == [
        "tree['a'][0]",
        "tree['a'][1].weights",
        "tree['a'][1].label[0]",
        "tree['a'][1].note",
        "tree['b'][0]",
        "tree['b'][1]",
    ]
    assert isinstance(Field("x"), str)


def test_defaultdict_ordereddict_and_frozen_dataclass_survive():
    dd = collections.defaultdict(list, {"x": 1})
    out = map_with_path(lambda _, x: x * 2 if isinstance(x, int) else x, dd)
    assert isinstance(out, collections.defaultdict) and out.default_factory is list
    assert out["x"] == 2
    od = collections.OrderedDict([("b", 1), ("a", 2)])
    assert list(map_with_path(lambda _, x: x, od)) == ["b", "a"]
    rec = Record(weights=1, label=2)
    out = map_with_path(lambda _, x: x + 1 if isinstance(x, int) else x, rec)
    assert out == Record(weights=2, label=3) and rec == Record(weights=1, label=2)


def test_cycles_are_refused_naming_where_they_close():
    loop = [1, 2]
    loop.append(loop)
    with pytest.raises(ArgumentError, match=r"got tree\['x'\]\[2\], which is tree\['x'\] itself"):
        map_with_path(lambda _, x: x, {"x": loop})
    outer = {"k": {}}
    outer["k"]["back"] = outer
    with pytest.raises(ArgumentError, match=r"tree\['k'\]\['back'\], which is tree itself"):
        leaves(outer)
    rec = Record(weights=[], label=0)
    rec.weights.append(rec)
    with pytest.raises(ArgumentError, match=r"tree\.weights\[0\], which is tree itself"):
        convert(rec, to="numpy")


def test_a_container_shared_by_two_branches_is_no_cycle():
    shared = [1, 2]
    out = map_with_path(lambda _, x: x * 10, {"a": shared, "b": (shared, shared)})
    assert out == {"a": [10, 20], "b": ([10, 20], [10, 20])}
