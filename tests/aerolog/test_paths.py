"""Every path a DashBoard writes to is checked before anything is created or written.

``DashBoard(log_path=<a file>)`` once failed at the first `log` with a bare
FileExistsError; a record that was a folder, or a metrics.csv that was one, failed after
the other files had been written. Now each is an ArgumentError naming the argument, the
value and what was expected, raised at construction (log_path) or before `log` writes
anything (record and the files it writes).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from dualtrain.aerolog import DashBoard
from dualtrain.errors import ArgumentError


def _console() -> Console:
    return Console(file=io.StringIO(), force_terminal=False)


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize(
    ("make", "log_path", "message"),
    [
        (lambda r: (r / "f.txt").write_text("x"), "f.txt", r"log_path must be a folder.* a file"),
        (
            lambda r: (r / "f.txt").write_text("x"),
            "f.txt/logs",
            r"'.*f\.txt' on the way there is a file",
        ),
        (lambda r: None, "bad\x00name", r"log_path must be a folder path without NUL"),
        (lambda r: None, 3, r"log_path must be a folder path \(str or os\.PathLike\)"),
    ],
    ids=["existing file", "file on the way", "NUL", "not a path"],
)
def test_a_bad_log_path_is_refused_at_construction(tmp_path, make, log_path, message):
    make(tmp_path)
    before = _tree(tmp_path)
    value = tmp_path / log_path if isinstance(log_path, str) else log_path
    with pytest.raises(ArgumentError, match=message):
        DashBoard(value, console=_console())
    assert _tree(tmp_path) == before  # nothing created


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_parent_is_refused_at_construction(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ArgumentError, match=r"log_path must be a folder that can be made"):
            DashBoard(locked / "logs", console=_console())
    finally:
        locked.chmod(0o700)


def test_a_folder_not_made_yet_is_taken_and_made_at_log(tmp_path):
    dash = DashBoard(tmp_path / "a" / "b", console=_console())
    assert not (tmp_path / "a").exists()  # made when first written, not before
    dash.gauge({"loss": 1.0}, 1, 0, 1, "train")
    assert (tmp_path / "a" / "b" / "metrics.csv") in dash.log(gauge=False)


@pytest.mark.parametrize(
    ("blocker", "kwargs", "message"),
    [
        ("history.csv", {"record": "history.csv"}, r"record must be a file name; .* is a folder"),
        ("metrics.csv", {}, r"log_path must be a file name; .*metrics\.csv' is a folder"),
        ("loss.png", {}, r"log_path must be a file name; .*loss\.png' is a folder"),
        (None, {"record": "a\x00b.csv"}, r"record must be a file name without NUL"),
    ],
)
def test_a_folder_where_log_writes_a_file_is_refused_before_any_write(
    tmp_path, blocker, kwargs, message
):
    dash = DashBoard(tmp_path, console=_console())
    dash.gauge({"loss": 1.0}, 1, 0, 1, "train")
    if blocker:
        (tmp_path / blocker).mkdir()
    before = _tree(tmp_path)
    with pytest.raises(ArgumentError, match=message):
        dash.log(**kwargs)
    assert _tree(tmp_path) == before


def test_a_record_of_another_kind_is_refused_before_any_write(tmp_path):
    dash = DashBoard(tmp_path, console=_console())
    dash.gauge({"loss": 1.0}, 1, 0, 1, "train")
    (tmp_path / "other.csv").write_text("not,a,record\n")
    before = _tree(tmp_path)
    with pytest.raises(
        ArgumentError, match=r"record must be a dashboard record file; .* not a dashboard record"
    ):
        dash.log(record="other.csv")
    assert _tree(tmp_path) == before  # metrics.csv was written first, once


def test_a_log_path_replaced_by_a_file_after_construction_is_refused_at_log(tmp_path):
    dash = DashBoard(tmp_path / "logs", console=_console())
    dash.gauge({"loss": 1.0}, 1, 0, 1, "train")
    (tmp_path / "logs").write_text("x")
    with pytest.raises(ArgumentError, match=r"log_path must be a folder"):
        dash.log()
