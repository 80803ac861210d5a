"""`MetricBook`: every gauged value by stage and metric, with moving and epoch means.

Values arrive as host floats (the dashboard reads device scalars before they get here).
A moving mean covers the last `window` values of the same epoch: it starts again with each
epoch, so a stage gauged once an epoch (a test accuracy) shows that epoch's value.
An epoch's mean is over the steps that were reported, not divided by the epoch's length: a
loop that breaks early or gauges every few steps still gets the right mean.

Points are stored as columns of machine numbers (32 bytes a point, plus 4 for the order of
arrival), not as objects, so a run of millions of steps keeps its whole history.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

__all__ = ["MetricBook", "Point"]


@dataclass(frozen=True)
class Point:
    """One gauged value: where in training it was (epoch, mile of mpe) and what it was."""

    stage: str
    key: str
    epoch: int
    mile: int
    mpe: int
    value: float

    @property
    def position(self) -> float:
        """Epochs into training: ``epoch + mile / mpe`` (stages with other mpe line up)."""
        return self.epoch + self.mile / self.mpe


class _Column:
    """One metric of one stage: its points as four arrays."""

    def __init__(self) -> None:
        self.epochs, self.miles, self.mpes = array("q"), array("q"), array("q")
        self.values = array("d")

    def __len__(self) -> int:
        return len(self.values)

    def append(self, point: Point) -> None:
        self.epochs.append(point.epoch)
        self.miles.append(point.mile)
        self.mpes.append(point.mpe)
        self.values.append(point.value)

    def point(self, slot: tuple[str, str], i: int) -> Point:
        return Point(slot[0], slot[1], self.epochs[i], self.miles[i], self.mpes[i],
                     self.values[i])  # fmt: skip


class MetricBook:
    """Points per (stage, key) in arrival order, and a moving window of `window` values."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._points: dict[tuple[str, str], _Column] = {}
        self._slot_ids: dict[tuple[str, str], int] = {}
        self._recent: dict[tuple[str, str], deque[float]] = {}
        self._recent_epoch: dict[tuple[str, str], int] = {}
        self._arrived = array("I")  # each point's slot, in arrival order
        self._sums: dict[tuple[str, str], dict[int, list[float]]] = {}  # epoch -> [sum, n]
        self.logged = 0  # points already appended to a record file

    def add(self, point: Point) -> None:
        """Files `point` under its stage and key."""
        slot = (point.stage, point.key)
        column = self._points.get(slot)
        if column is None:
            column = self._points[slot] = _Column()
            self._slot_ids[slot] = len(self._slot_ids)
        column.append(point)
        recent = self._recent.get(slot)
        if recent is None or self._recent_epoch[slot] != point.epoch:
            recent = self._recent[slot] = deque(maxlen=self.window)  # a new epoch: anew
            self._recent_epoch[slot] = point.epoch
        recent.append(point.value)
        self._arrived.append(self._slot_ids[slot])
        total = self._sums.setdefault(slot, {}).setdefault(point.epoch, [0.0, 0])
        total[0] += point.value
        total[1] += 1

    def slots(self) -> list[tuple[str, str]]:
        """(stage, key) pairs in the order they first appeared."""
        return list(self._points)

    def points(self, stage: str, key: str) -> list[Point]:
        """The points of one metric in one stage, oldest first."""
        slot = (stage, key)
        column = self._points.get(slot)
        return [] if column is None else [column.point(slot, i) for i in range(len(column))]

    def __len__(self) -> int:
        return len(self._arrived)

    def first_epoch(self) -> int:
        """The smallest epoch gauged (0 before any)."""
        return min((min(c.epochs) for c in self._points.values() if len(c)), default=0)

    def all_points(self, start: int = 0) -> list[Point]:
        """Every point from the `start`-th on, in the order they arrived."""
        slots = list(self._points)
        seen = [0] * len(slots)
        for slot_id in self._arrived[:start]:
            seen[slot_id] += 1
        out = []
        for slot_id in self._arrived[start:]:
            slot = slots[slot_id]
            out.append(self._points[slot].point(slot, seen[slot_id]))
            seen[slot_id] += 1
        return out

    def moving(self, stage: str, key: str) -> float | None:
        """The mean of the last `window` values (None before any)."""
        recent = self._recent.get((stage, key))
        return sum(recent) / len(recent) if recent else None

    def moving_series(self, stage: str, key: str, last: int | None = None) -> list[float]:
        """The moving mean at each point (or the `last` points), oldest first.

        Costs O(last + window), not O(history): the live curve asks for it on every read.
        """
        column = self._points.get((stage, key))
        if column is None:
            return []
        start = 0 if last is None else max(0, len(column) - last - self.window + 1)
        out, window, total, epoch = [], deque[float](), 0.0, None
        for e, v in zip(column.epochs[start:], column.values[start:], strict=True):
            if e != epoch:  # the window starts again with each epoch
                window, total, epoch = deque(), 0.0, e
            window.append(v)
            total += v
            if len(window) > self.window:
                total -= window.popleft()
            out.append(total / len(window))
        return out if last is None else out[-last:] if last else []

    def epoch_means(self, stage: str, key: str) -> dict[int, float]:
        """Epoch -> the mean of the values reported in it."""
        sums = self._sums.get((stage, key), {})
        return {epoch: total / count for epoch, (total, count) in sums.items()}

    def epoch_counts(self, stage: str, key: str) -> dict[int, int]:
        """Epoch -> how many values were reported in it."""
        return {epoch: int(n) for epoch, (_, n) in self._sums.get((stage, key), {}).items()}
