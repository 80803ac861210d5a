"""`MetricBook`: every gauged value by stage and metric, with moving and epoch means.

Values arrive as host floats (the dashboard reads device scalars before they get here).
A moving mean covers the last `window` values of the same epoch: it starts again with each
epoch, so a stage gauged once an epoch (a test accuracy) shows that epoch's value.
An epoch's mean is over the steps that were reported, not divided by the epoch's length: a
loop that breaks early or gauges every few steps still gets the right mean.
"""

from __future__ import annotations

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


class MetricBook:
    """Points per (stage, key) in arrival order, and a moving window of `window` values."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._points: dict[tuple[str, str], list[Point]] = {}
        self._recent: dict[tuple[str, str], deque[float]] = {}
        self._recent_epoch: dict[tuple[str, str], int] = {}
        self._arrived: list[Point] = []
        self._sums: dict[tuple[str, str], dict[int, list[float]]] = {}  # epoch -> [sum, n]
        self.logged = 0  # points already appended to a record file

    def add(self, point: Point) -> None:
        """Files `point` under its stage and key."""
        slot = (point.stage, point.key)
        self._points.setdefault(slot, []).append(point)
        recent = self._recent.get(slot)
        if recent is None or self._recent_epoch[slot] != point.epoch:
            recent = self._recent[slot] = deque(maxlen=self.window)  # a new epoch: anew
            self._recent_epoch[slot] = point.epoch
        recent.append(point.value)
        self._arrived.append(point)
        total = self._sums.setdefault(slot, {}).setdefault(point.epoch, [0.0, 0])
        total[0] += point.value
        total[1] += 1

    def slots(self) -> list[tuple[str, str]]:
        """(stage, key) pairs in the order they first appeared."""
        return list(self._points)

    def points(self, stage: str, key: str) -> list[Point]:
        """The points of one metric in one stage, oldest first."""
        return list(self._points.get((stage, key), ()))

    def all_points(self) -> list[Point]:
        """Every point, in the order they arrived."""
        return list(self._arrived)

    def moving(self, stage: str, key: str) -> float | None:
        """The mean of the last `window` values (None before any)."""
        recent = self._recent.get((stage, key))
        return sum(recent) / len(recent) if recent else None

    def moving_series(self, stage: str, key: str, last: int | None = None) -> list[float]:
        """The moving mean at each point (or the `last` points), oldest first.

        Costs O(last + window), not O(history): the live curve asks for it on every read.
        """
        points = self._points.get((stage, key), [])
        start = 0 if last is None else max(0, len(points) - last - self.window + 1)
        out, window, total, epoch = [], deque[float](), 0.0, None
        for p in points[start:]:
            if p.epoch != epoch:  # the window starts again with each epoch
                window, total, epoch = deque(), 0.0, p.epoch
            window.append(p.value)
            total += p.value
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
