"""The decision cache on disk: round trips, damaged files, atomic writes, folders it cannot use."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from dualtrain.accelerate import Attempt, Decision, DecisionCache
from dualtrain.accelerate.decisions import fingerprint
from dualtrain.atomic import TEMP_SUFFIX

STATUSES = ("chosen", "verified", "rejected", "unavailable", "failed")
maybe_float = st.none() | st.floats(allow_nan=False) | st.just(float("inf"))

attempts = st.builds(
    Attempt,
    rung=st.sampled_from(["TORCH_COMPILE", "CHANNELS_LAST", "JIT", "PYTORCH", "EAGER"]),
    status=st.sampled_from(STATUSES),
    reason=st.text(max_size=40),
    compile_s=maybe_float,
    step_ms=maybe_float,
    speedup=maybe_float,
    max_error=maybe_float,
)
decisions = st.builds(
    Decision,
    mode=st.sampled_from(["train", "eval"]),
    signature=st.text(max_size=30),
    chosen=st.sampled_from(["TORCH_COMPILE", "PYTORCH", "JIT"]),
    attempts=st.lists(attempts, max_size=5),
    decide_s=st.floats(0, 1e4),
)


def decision() -> Decision:
    return Decision(
        "train",
        "(f32[8,3]@cpu)",
        "JIT",
        [
            Attempt("JIT", "chosen", "verified and fastest", 0.4, 0.1, 7.5, 1e-7),
            Attempt("EAGER", "verified", "the reference", None, 0.75, 1.0, None),
        ],
        decide_s=0.9,
    )


def temporaries(folder: Path) -> list[str]:
    return [name for name in os.listdir(folder) if name.endswith(TEMP_SUFFIX)]


@given(found=decisions)
def test_put_get_round_trip(tmp_path_factory, found):
    cache = DecisionCache(tmp_path_factory.mktemp("decisions"))
    key = fingerprint({"signature": found.signature})
    assert cache.get(key) is None
    cache.put(key, found)
    back = cache.get(key)
    assert back is not None
    assert (back.chosen, back.attempts) == (found.chosen, found.attempts)
    assert (back.mode, back.signature, back.decide_s) == (
        found.mode,
        found.signature,
        found.decide_s,
    )
    assert back.from_cache is True
    assert temporaries(cache.folder) == []


def test_put_replaces_and_keys_are_apart(tmp_path):
    cache = DecisionCache(tmp_path / "new" / "folder")  # created on the first put
    first, second = decision(), decision()
    second.chosen = "EAGER"
    cache.put("a", first)
    cache.put("b", second)
    assert cache.get("a").chosen == "JIT"
    assert cache.get("b").chosen == "EAGER"
    cache.put("a", second)
    assert cache.get("a").chosen == "EAGER"
    assert sorted(os.listdir(cache.folder)) == ["a.json", "b.json"]  # nothing else left


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "not json at all",
        "[]",
        "null",
        "3",
        '"a string"',
        "{}",
        '{"format": 1, "key": "k"}',
        '{"format": 1, "key": "other", "decision": null}',
        '{"format": 1, "key": "k", "decision": []}',
        '{"format": 1, "key": "k", "decision": "train"}',
        '{"format": 1, "key": "k", "decision": {"mode": "train"}}',
        '{"format": 1, "key": "k", "decision": {"mode": "train", "signature": "s", '
        '"chosen": "JIT", "attempts": [{"rung": "JIT"}]}}',
        '{"format": 1, "key": "k", "decision": {"mode": "train", "signature": "s", '
        '"chosen": "JIT", "attempts": [["JIT", "chosen"]]}}',
        '{"format": 1, "key": "k", "decision": {"mode": "train", "signature": "s", '
        '"chosen": "JIT", "attempts": [], "decide_s": "soon"}}',
    ],
)
def test_get_ignores_damaged_files(tmp_path, text):
    cache = DecisionCache(tmp_path)
    (tmp_path / "k.json").write_text(text)
    assert cache.get("k") is None
    cache.put("k", decision())  # and a put replaces it
    assert cache.get("k").chosen == "JIT"


def test_get_ignores_binary_garbage_and_other_formats(tmp_path):
    cache = DecisionCache(tmp_path)
    (tmp_path / "k.json").write_bytes(b"\xff\xfe\x00garbage")
    assert cache.get("k") is None
    cache.put("k", decision())
    data = json.loads((tmp_path / "k.json").read_text())
    assert data["key"] == "k"
    data["format"] = data["format"] + 1  # a file of another (future) format
    (tmp_path / "k.json").write_text(json.dumps(data))
    assert cache.get("k") is None
    data["format"] -= 1
    (tmp_path / "other.json").write_text(json.dumps(data))  # a file moved under another key
    assert cache.get("other") is None
    (tmp_path / "folder.json").mkdir()  # not a file at all
    assert cache.get("folder") is None


def test_no_folder_keeps_nothing(tmp_path):
    cache = DecisionCache(None)
    cache.put("k", decision())
    assert cache.get("k") is None
    assert cache.clear() == 0


def test_put_into_a_folder_that_cannot_be_made_is_skipped(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("in the way")
    cache = DecisionCache(blocker / "accelerate")
    cache.put("k", decision())  # no error
    assert cache.get("k") is None
    assert cache.clear() == 0
    assert blocker.read_text() == "in the way"


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only folders"
)
def test_put_into_a_read_only_folder_is_skipped(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        cache = DecisionCache(folder)
        cache.put("k", decision())
        assert cache.get("k") is None
        assert os.listdir(folder) == []
    finally:
        folder.chmod(0o700)


def test_clear_removes_every_decision(tmp_path):
    cache = DecisionCache(tmp_path / "cache")
    assert cache.clear() == 0  # no folder yet
    for key in "abc":
        cache.put(key, decision())
    (tmp_path / "cache" / "notes.txt").write_text("not ours")
    assert cache.clear() == 3
    assert all(cache.get(key) is None for key in "abc")
    assert os.listdir(tmp_path / "cache") == ["notes.txt"]
    assert cache.clear() == 0


def test_fingerprint_depends_on_every_part():
    parts = {"mode": "train", "signature": "f32[8]", "backends": ["JIT", "EAGER"]}
    key = fingerprint(parts)
    assert key == fingerprint(dict(reversed(parts.items())))  # order of the keys is no part
    assert len(key) == 32 and int(key, 16) >= 0
    for name, other in [("mode", "eval"), ("signature", "f32[9]"), ("backends", ["EAGER"])]:
        assert fingerprint({**parts, name: other}) != key
    assert fingerprint({**parts, "device": "cpu"}) != key
