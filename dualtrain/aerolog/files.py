"""The dashboard's files: a CSV of every point, one of epoch means, PNG curves, a record.

Each file is written whole to a temporary name and renamed (`dualtrain.atomic`), so an
interrupted `log` leaves the previous files as they were. A record file grows by appending
the points logged since the last call, also by writing the whole new file and renaming.
Curves are drawn by matplotlib's Agg canvas on a `Figure` of its own (no pyplot state).
"""

from __future__ import annotations

import csv
import io
import os
import re
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.aerolog.book import MetricBook, Point
from dualtrain.atomic import atomic_target
from dualtrain.errors import ArgumentError, bad_argument

__all__ = [
    "POINT_HEADER",
    "append_record",
    "check_file",
    "check_folder",
    "curve_paths",
    "write_curves",
    "write_epochs",
    "write_points",
]

POINT_HEADER = ("stage", "epoch", "mile", "mpe", "key", "value")
_EPOCH_HEADER = ("stage", "epoch", "key", "mean", "points")


def check_folder(name: str, value: object) -> Path:
    """`value` as a folder to write into, checked now; nothing is created.

    It is a folder, or nothing yet under a folder this process may write into (it is made
    when first written); not a file, not under a file, not with a NUL in its name.

    Raises:
        ArgumentError: naming `name`, the value and what is wrong.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise bad_argument(name, value, "a folder path (str or os.PathLike)")
    path = Path(value)
    if "\x00" in str(path):
        raise bad_argument(name, value, "a folder path without NUL characters")
    if path.exists():
        if not path.is_dir():
            raise bad_argument(
                name, value, "a folder, or a path where one can be made; it is a file"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise bad_argument(name, value, "a folder this process may write into")
        return path
    parent = path.absolute().parent
    while not parent.exists():  # the nearest existing ancestor decides
        parent = parent.parent
    if not parent.is_dir():
        raise bad_argument(
            name, value, f"a folder path; {str(parent)!r} on the way there is a file"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise bad_argument(
            name, value, f"a folder that can be made; {str(parent)!r} is not writable"
        )
    return path


def check_file(name: str, path: Path, value: object, header: tuple[str, ...] = ()) -> None:
    """Refuses a `path` that cannot be written as a file.

    It must not be a folder; with `header`, an existing file must start with it (a record
    file, appended to).

    Raises:
        ArgumentError: naming `name`, the `value` given and what is wrong.
    """
    if "\x00" in str(path):
        raise bad_argument(name, value, "a file name without NUL characters")
    if path.is_dir():
        raise bad_argument(name, value, f"a file name; {str(path)!r} is a folder")
    if header and path.exists():
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                first = f.readline()
        except OSError as e:
            raise bad_argument(name, value, f"a readable record file ({e})") from e
        if first and not first.startswith(",".join(header)):
            raise bad_argument(
                name,
                value,
                f"a dashboard record file; {str(path)!r} is not a dashboard record (its "
                "header differs)",
            )


def _rows_text(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def _point_row(p: Point) -> tuple[object, ...]:
    return (p.stage, p.epoch, p.mile, p.mpe, p.key, repr(p.value))  # repr: exact floats


def _write(path: Path, text: str) -> None:
    with atomic_target(path) as tmp:
        Path(tmp).write_text(text)


def write_points(book: MetricBook, path: Path) -> None:
    """Every point, one row each (`POINT_HEADER`)."""
    _write(path, _rows_text(POINT_HEADER, [_point_row(p) for p in book.all_points()]))


def write_epochs(book: MetricBook, path: Path) -> None:
    """Each metric's mean per stage and epoch, over the points reported in it."""
    rows: list[tuple[object, ...]] = []
    for stage, key in book.slots():
        counts = book.epoch_counts(stage, key)
        for epoch, mean in book.epoch_means(stage, key).items():
            rows.append((stage, epoch, key, repr(mean), counts[epoch]))
    _write(path, _rows_text(_EPOCH_HEADER, rows))


def append_record(book: MetricBook, path: Path) -> int:
    """Appends the points not yet recorded to `path` (its header once); returns how many."""
    fresh = book.all_points(book.logged)
    if path.exists():
        old = path.read_text()
        if old and not old.startswith(",".join(POINT_HEADER)):
            raise ArgumentError(f"{path} is not a dashboard record (its header differs)")
        old = old if old.endswith("\n") or not old else old + "\n"
    else:
        old = ""
    text = _rows_text(POINT_HEADER, [_point_row(p) for p in fresh])
    _write(path, old + (text.split("\n", 1)[1] if old else text))
    book.logged += len(fresh)
    return len(fresh)


def write_curves(book: MetricBook, folder: Path) -> list[Path]:
    """One PNG per metric: each stage's moving mean against epochs, and its epoch means.

    A metric matplotlib cannot draw (values too large to scale) is left out with a warning.
    """
    keys: dict[str, list[str]] = {}
    for stage, key in book.slots():
        keys.setdefault(key, []).append(stage)
    names = _file_names(list(keys))
    # X: epochs since the first gauged one began (1-based and 0-based epochs draw alike).
    first = book.first_epoch()
    written = []
    for key, stages in keys.items():
        path = folder / f"{names[key]}.png"
        try:  # matplotlib scaling values near 1e308 overflows: no curve then, and a warning
            with np.errstate(all="ignore"):
                fig = _figure(book, key, stages, first)
                with atomic_target(path) as tmp:
                    fig.savefig(tmp, format="png")
        except (ValueError, OverflowError) as err:
            warnings.warn(f"{key}: no curve drawn ({err})", RuntimeWarning, stacklevel=3)
            continue
        written.append(path)
    return written


def curve_paths(book: MetricBook, folder: Path) -> list[Path]:
    """The PNG files `write_curves` would write into `folder`, one per metric."""
    keys = list(dict.fromkeys(key for _, key in book.slots()))
    names = _file_names(keys)
    return [folder / f"{names[key]}.png" for key in keys]


def _figure(book: MetricBook, key: str, stages: list[str], first: int) -> Any:
    """One metric's figure: each stage's moving mean, and its epoch means as dots."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for stage in stages:
        points = book.points(stage, key)
        (line,) = ax.plot(
            [p.position - first for p in points], book.moving_series(stage, key),
            label=stage, linewidth=1.2,
        )  # fmt: skip
        means = book.epoch_means(stage, key)
        ax.plot(
            [e - first + 1 for e in means], list(means.values()), "o",
            color=line.get_color(), markersize=4, label=f"{stage} (epoch mean)",
        )  # fmt: skip
    ax.set_xlabel("epochs")
    ax.set_ylabel(key)
    ax.set_title(f"{key} (moving mean over {book.window})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _file_names(keys: list[str]) -> dict[str, str]:
    """Each metric's file name: odd characters replaced; a short hash where two would meet."""
    plain = {k: re.sub(r"[^A-Za-z0-9._-]+", "_", k).strip("._") or "metric" for k in keys}
    taken = list(plain.values())
    return {
        k: name if taken.count(name) == 1 else f"{name}-{zlib.crc32(k.encode()):08x}"
        for k, name in plain.items()
    }
