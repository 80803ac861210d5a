"""What `TimeMachine.to` refuses, `drop` refuses first, naming it; what `drop` writes, `to` loads.

The reader's limits (a header of at most safetensors' 100,000,000 bytes, a manifest of JSON
that loads back as it was given) are the writer's, checked before anything is written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import ArgumentError, CheckpointError, TimeMachine
from dualtrain.checkpoint.anchor_file import MAX_HEADER, header_length, numpy_scalars
from tests.checkpoint.crafts import Net

FRAMEWORKS = ("torch", "jax")


def realize(framework: str, seed: int = 0) -> Any:
    craft = pytest.importorskip(f"dualtrain_{framework}.craft")
    return craft.realize(Net(), seed=seed)


def written(folder: Path) -> list[str]:
    """Every file in `folder`, temporary ones included."""
    return sorted(p.name for p in folder.iterdir())


def same(a: Any, b: Any) -> bool:
    """JSON equality with NaN equal to itself and tuples read back as lists."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return (type(a) is type(b) and a == b) or (isinstance(a, np.generic) and a == b)


# Any code point, lone surrogates and NUL included: JSON escapes them and reads them back.
texts = st.text(st.characters(exclude_categories=()), max_size=8)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | texts,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
bad_keys = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.none())


@pytest.mark.parametrize("framework", FRAMEWORKS)
@settings(max_examples=25)
@given(extra=st.dictionaries(texts, json_values, max_size=4))
def test_any_extra_drop_accepts_loads_back_as_given(tmp_path_factory, framework, extra):
    module = realize(framework)
    tm = TimeMachine(save_path=tmp_path_factory.mktemp("x"))
    restored = tm.to(module, tm.drop(module, "a", extra=extra, step=2**64))
    assert same(extra, restored.extra) and restored.step == 2**64


@pytest.mark.parametrize("framework", FRAMEWORKS)
@settings(max_examples=25)
@given(
    key=bad_keys,
    path=st.lists(st.sampled_from(["dict", "list"]), max_size=3),
)
def test_a_key_json_would_turn_into_a_string_is_refused_naming_where(
    tmp_path_factory, framework, key, path
):
    """``{1: x}`` would load as ``{"1": x}``: refused before anything is written."""
    folder = tmp_path_factory.mktemp("k")
    value: object = {key: "v"}
    where = ""
    for kind in reversed(path):
        value = {"k": value} if kind == "dict" else [0, value]
    for kind in path:
        where += "['k']" if kind == "dict" else "[1]"
    module = realize(framework)
    with pytest.raises(ArgumentError) as err:
        TimeMachine(save_path=folder).drop(module, "a", extra={"top": value})
    assert f"extra['top']{where} has the key {key!r}" in str(err.value)
    assert "JSON keys are strings" in str(err.value)
    assert written(folder) == []


unstorable = st.sampled_from([object(), np.zeros(2), {1, 2}, b"bytes", 1j, print])


@pytest.mark.parametrize("framework", FRAMEWORKS)
@settings(max_examples=20)
@given(
    extra=st.recursive(
        unstorable,
        lambda inner: (
            st.lists(inner, min_size=1, max_size=2).map(lambda v: [*v, 1])
            | st.dictionaries(texts, inner, min_size=1, max_size=2)
        ),
        max_leaves=4,
    ).map(lambda v: {"ok": 1, "bad": v})
)
def test_extra_to_would_not_give_back_is_refused_before_writing(tmp_path_factory, framework, extra):
    folder = tmp_path_factory.mktemp("u")
    with pytest.raises(ArgumentError, match="extra must be JSON-serializable"):
        TimeMachine(save_path=folder).drop(realize(framework), extra=extra)
    assert written(folder) == []


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    "extra, says",
    [
        ([1], "extra must be a dict"),
        ({"a": object()}, "extra must be JSON-serializable"),
        ({"a": np.zeros(2)}, "extra must be JSON-serializable"),
        ({"a": 10**5000}, "extra must be JSON-serializable"),
    ],
)
def test_extra_that_cannot_be_stored_is_refused_first(tmp_path, framework, extra, says):
    with pytest.raises(ArgumentError, match=says):
        TimeMachine(save_path=tmp_path).drop(realize(framework), "a", extra=extra)
    assert written(tmp_path) == []


def test_circular_extra_is_refused(tmp_path):
    loop: dict = {}
    loop["me"] = loop
    with pytest.raises(ArgumentError, match="Circular reference"):
        TimeMachine(save_path=tmp_path).drop(realize("torch"), "a", extra={"loop": loop})
    assert written(tmp_path) == []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_step_json_cannot_hold_is_refused_naming_step(tmp_path, framework):
    with pytest.raises(ArgumentError, match="step must be an int JSON can hold; got one of"):
        TimeMachine(save_path=tmp_path).drop(realize(framework), "a", step=10**5000)
    assert written(tmp_path) == []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_numpy_scalars_in_extra_load_as_their_values(tmp_path, framework):
    module = realize(framework)
    tm = TimeMachine(save_path=tmp_path)
    extra = {"lr": np.float32(0.1), "epoch": np.int64(3), "done": np.bool_(True)}
    got = tm.to(module, tm.drop(module, "a", extra=extra, step=np.uint64(2**64 - 1))).extra
    assert got == {k: v.item() for k, v in extra.items()}


def largest_blob(module: Any) -> int:
    """The longest ``extra={"blob": "x" * k}`` whose anchor's header fits the limit."""
    tensors, manifest = TimeMachine()._payload(module, None, None, None, {"blob": ""}, None)

    def length(k: int) -> int:
        manifest["extra"] = {"blob": "x" * k}
        return header_length(tensors, manifest, numpy_scalars)

    # The header grows a byte a character, then is padded to 8: the unpadded length at k = 0
    # is where the padded length first grows.
    grows = next(j for j in range(1, 9) if length(j) > length(0))
    return MAX_HEADER - (length(0) + 1 - grows)


@pytest.mark.slow
def test_the_largest_extra_drop_writes_loads_and_one_byte_more_is_refused(tmp_path):
    """The issue's case: an extra over 100 MB was written, then refused by `to` as truncated."""
    module = realize("torch")
    k = largest_blob(module)
    tm = TimeMachine(save_path=tmp_path)
    with pytest.raises(ArgumentError) as err:
        tm.drop(module, "over", extra={"blob": "x" * (k + 1)})
    message = str(err.value)
    assert f"extra is {k + 1 + 12:,} bytes of JSON" in message  # {"blob": "..."}
    assert "over the 100,000,000-byte limit" in message
    assert written(tmp_path) == []
    anchor = tm.drop(module, "fits", extra={"blob": "x" * k})
    assert tm.to(module, anchor).extra["blob"] == "x" * k


def test_the_reader_names_the_header_limit(tmp_path):
    """A header over the limit in a file long enough to hold it: the limit is named."""
    path = tmp_path / "long.safetensors"
    with open(path, "wb") as f:  # sparse: 100 MB of nothing on disk
        f.write((MAX_HEADER + 8).to_bytes(8, "little"))
        f.truncate(MAX_HEADER + 64)
    with pytest.raises(CheckpointError, match=r"header of 100,000,008 bytes, over the 100,000,000"):
        TimeMachine().to(realize("torch"), path)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("char", ["a", "é"])  # the limit is in bytes, not characters
def test_a_file_name_of_255_bytes_round_trips_and_256_is_refused_naming_file(
    tmp_path, framework, char
):
    module = realize(framework)
    tm = TimeMachine(save_path=tmp_path)
    room = 255 - len(".safetensors")
    name = char * (room // len(char.encode()))
    assert list(tm.to(module, tm.drop(module, name))) == []
    over = name + "a" * (room - len(name.encode()) + 1)
    with pytest.raises(ArgumentError, match=r"file must give a file name of at most 255 bytes"):
        tm.drop(module, over)
    assert written(tmp_path) == [f"{name}.safetensors"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_scope_too_long_for_numbered_names_is_refused_naming_it(tmp_path, framework):
    craft = pytest.importorskip(f"dualtrain_{framework}.craft")
    module = craft.realize(Net(scope="s" * 250))
    with pytest.raises(ArgumentError, match=r"craft's scope 's+' gives numbered anchors names"):
        TimeMachine(save_path=tmp_path).drop(module)
    assert written(tmp_path) == []
